"""Trainer-stream ordering on the host path, with real daemons. The trainer's "optimizer step"
is a fake delayed writer standing in for kernels still running on a CUDA stream: its writes
land on another thread, later, and its synchronize() waits for them (as
torch.cuda.Stream.synchronize does). Registered with ``ready=writer``, the step started with
``ctl.step(version, ready=[session])`` never lets the agent read before the writes landed;
the control case shows that without it the agent reads the old bytes."""

import threading
import time
import unittest

import numpy as np

import weightbeam
from cluster import Cluster

SHAPE = (64, 128)


class DelayedWriter:
    """Writes land on a thread after `gate` opens; synchronize() waits for the last write."""

    def __init__(self, array):
        self.array = array
        self.thread = None
        self.landed_at = None
        self.syncs = 0

    def launch(self, values, gate):
        def run():
            gate()
            self.array[...] = values
            self.landed_at = time.monotonic()
        self.thread = threading.Thread(target=run)
        self.thread.start()

    def synchronize(self):
        self.syncs += 1
        if self.thread is not None:
            self.thread.join()


class StepWaitsForTheTrainersWrites(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(["node"], trainer_ranks=1)
        sock = cls.cluster.sockets["node"]
        cls.trainer = weightbeam.LocalSession(sock, "trainer", rank=0)
        cls.tbuf = weightbeam.SharedBuffer(SHAPE[0] * SHAPE[1] * 2, "trainer")
        cls.source = cls.tbuf.array(np.uint16, SHAPE, 0)
        cls.writer = DelayedWriter(cls.source)
        cls.trainer.register("w", "bf16", SHAPE, buffer=cls.source, ready=cls.writer)
        cls.worker = weightbeam.LocalSession(sock, "inference", rank=0, replica=0)
        cls.wbuf = weightbeam.SharedBuffer(SHAPE[0] * SHAPE[1] * 2, "worker")
        cls.dest = cls.wbuf.array(np.uint16, SHAPE, 0)
        cls.worker.register("w", "bf16", SHAPE, buffer=cls.dest)
        cls.worker.watch()
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

    def test_1_without_waiting_the_agent_reads_the_old_bytes(self):
        # The control: the writes are held back until after the step, so a step started
        # without sources_ready() ships what the buffer held before them.
        old = np.full(SHAPE, 0x1111, np.uint16)
        self.source[...] = old
        gate = threading.Event()
        self.writer.launch(np.full(SHAPE, 0x2222, np.uint16), gate.wait)
        self.ctl.step(1)
        gate.set()
        self.writer.synchronize()
        np.testing.assert_array_equal(self.dest, old)

    def test_2_ready_makes_the_step_wait_for_the_writes(self):
        new = (np.arange(SHAPE[0] * SHAPE[1]) % 50000).astype(np.uint16).reshape(SHAPE)
        syncs = self.writer.syncs
        self.writer.launch(new, lambda: time.sleep(0.5))
        started = time.monotonic()
        result = self.ctl.step(2, ready=[self.trainer])
        self.assertTrue(result.ok)
        self.assertEqual(self.writer.syncs, syncs + 1)
        self.assertIsNotNone(self.writer.landed_at)
        self.assertGreaterEqual(self.writer.landed_at - started, 0.5 - 0.05)
        np.testing.assert_array_equal(self.dest, new)

    def test_3_sources_ready_runs_each_waiter_once(self):
        calls = []
        other = weightbeam.SharedBuffer(128, "other")
        self.addCleanup(other.close)
        self.trainer.register("x", "bf16", (8, 8), buffer=other, ready=lambda: calls.append("x"))
        try:
            syncs = self.writer.syncs
            self.trainer.sources_ready()
            self.assertEqual(calls, ["x"])
            self.assertEqual(self.writer.syncs, syncs + 1)
        finally:
            self.trainer.unregister("x")
        self.trainer.sources_ready()
        self.assertEqual(calls, ["x"])  # unregistered: no longer waited for


if __name__ == "__main__":
    unittest.main()
