"""Capture, then send (docs/clients.md), from Python with real daemons: one agent holds the
trainer's and the worker's tensor (the local transport), with room for one capture. The
trainer overwrites its weights as soon as the step has captured and the worker still gets the
captured version; a step asked for while the previous one sends waits for that send to capture
(wait_captured times out meanwhile, then returns); a failed step raises StepFailed from both
waits."""

import unittest

import numpy as np

import weightbeam
from cluster import Cluster

SHAPE = (64, 128)
BYTES = SHAPE[0] * SHAPE[1] * 2
SLOW = 3  # the version whose send is held (1.5 s)


def pattern(version):
    """Version `version`'s BF16 bits, computed on their own (positive normal numbers)."""
    i = np.arange(SHAPE[0] * SHAPE[1], dtype=np.uint32).reshape(SHAPE)
    return (0x3c00 + ((i * 11 + version * 7) & 0x3ff)).astype(np.uint16)


class CaptureThenSend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Appended inside the agent's executor: block, then a capture: block of its own.
        cls.cluster = Cluster(["node"], trainer_ranks=1, agent_yaml=lambda name: (
            f"  test_hold_version: {SLOW}\n  test_hold_ms: 1500\n"
            f"capture:\n  max_bytes: {BYTES + BYTES // 2}\n"))
        sock = cls.cluster.sockets["node"]
        cls.trainer = weightbeam.LocalSession(sock, "trainer", rank=0)
        cls.tbuf = weightbeam.SharedBuffer(BYTES, "trainer")
        cls.source = cls.tbuf.array(np.uint16, SHAPE, 0)
        cls.trainer.register("w", "bf16", SHAPE, buffer=cls.source)
        cls.worker = weightbeam.LocalSession(sock, "inference", rank=0, replica=0)
        cls.wbuf = weightbeam.SharedBuffer(BYTES, "worker")
        cls.dest = cls.wbuf.array(np.uint16, SHAPE, 0)
        cls.worker.register("w", "bf16", SHAPE, buffer=cls.dest)
        cls.ctl = weightbeam.ControllerClient(cls.cluster.controller_address)
        cls.ctl.plan(1, 1, 1, wait_s=30)

    @classmethod
    def tearDownClass(cls):
        cls.ctl.close()
        cls.trainer.close()
        cls.worker.close()
        cls.tbuf.close()
        cls.wbuf.close()
        cls.cluster.stop()

    def test_1_step_captured_then_overwrite(self):
        self.source[...] = pattern(1)
        handle = self.ctl.step_captured(1, timeout_s=30)
        self.source[...] = 0x4444  # the next iteration's weights
        captured = handle.wait_captured(0)
        self.assertEqual(captured.version, 1)
        self.assertEqual(captured.how, "captured")
        result = handle.result(30)
        self.assertTrue(result.ok)
        self.assertEqual(result.capture, "captured")
        self.assertLess(result.trainer_stall_seconds, result.seconds)
        np.testing.assert_array_equal(self.dest, pattern(1))

    def test_2_a_failed_step_raises_from_both_waits(self):
        handle = self.ctl.step_async(1, timeout_s=30)  # not newer than the committed version
        with self.assertRaises(weightbeam.StepFailed) as failed:
            handle.wait_captured(30)
        self.assertIn("not newer", str(failed.exception))
        with self.assertRaises(weightbeam.StepFailed):
            handle.result(30)

    def test_3_a_step_behind_a_slow_send_captures_after_it(self):
        self.source[...] = pattern(SLOW)
        slow = self.ctl.step_async(SLOW, timeout_s=30)
        self.assertEqual(slow.wait_captured(30).how, "captured")
        self.source[...] = pattern(SLOW + 1)
        with self.assertRaises(weightbeam.StepTimeout):
            slow.result(0.1)  # still sending
        nxt = self.ctl.step_async(SLOW + 1, timeout_s=30)
        # One capture fits the budget: the next step waits for the slow one's send.
        with self.assertRaises(weightbeam.StepTimeout):
            nxt.wait_captured(0.2)
        captured = nxt.wait_captured(30)
        self.assertEqual(captured.how, f"captured after step {SLOW}'s send")
        self.source[...] = 0x4444
        self.assertEqual(slow.result(30).capture, "captured")
        result = nxt.result(30)
        self.assertEqual(result.capture, f"captured after step {SLOW}'s send")
        self.assertAlmostEqual(result.trainer_stall_seconds, captured.seconds)
        np.testing.assert_array_equal(self.dest, pattern(SLOW + 1))


if __name__ == "__main__":
    unittest.main()
