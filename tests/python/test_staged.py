"""Agent receive.mode staged through the Python client, with real daemons: a worker that
watches with ack=True keeps serving version v-1 while v is transferred and until it
acknowledges begin(v); a worker that watches with swap=True hears "ready", copies the staged
bytes itself (from the agent's staging object, by name) and acknowledges; a failed swap drops
the replica from the step, naming the error."""

import mmap
import os
import threading
import time
import unittest

import numpy as np

import weightbeam
from cluster import Cluster

SHAPE = (64, 128)
NBYTES = SHAPE[0] * SHAPE[1] * 2
STAGED = "receive:\n  mode: staged\n  ack_timeout_ms: 3000\n"


def values(version):
    return (np.arange(SHAPE[0] * SHAPE[1], dtype=np.uint16).reshape(SHAPE) * 3 + version * 101)


def next_of(session, kind, version, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        e = session.next_event(timeout=deadline - time.monotonic())
        if e is not None and e.kind == kind and e.version == version:
            return e
    raise AssertionError(f"no {kind} {version} within {timeout} s")


class StagedSides:
    """One node: a trainer and an inference worker with one tensor each, planned."""

    def open(self, **watch):
        self.cluster = Cluster(["node"], trainer_ranks=1, agent_yaml=lambda name: STAGED)
        sock = self.cluster.sockets["node"]
        self.trainer = weightbeam.LocalSession(sock, "trainer", rank=0)
        self.tbuf = weightbeam.SharedBuffer(NBYTES, "trainer")
        self.source = self.tbuf.array(np.uint16, SHAPE, 0)
        self.trainer.register("w", "bf16", SHAPE, buffer=self.source)
        self.worker = weightbeam.LocalSession(sock, "inference", rank=0, replica=0)
        self.wbuf = weightbeam.SharedBuffer(NBYTES, "worker")
        self.dest = self.wbuf.array(np.uint16, SHAPE, 0)
        self.worker.register("w", "bf16", SHAPE, buffer=self.dest)
        self.worker.watch(**watch)
        self.ctl = weightbeam.ControllerClient(self.cluster.controller_address)
        self.ctl.plan(1, 1, 1, wait_s=30)

    def close(self):
        for c in (self.ctl, self.worker, self.trainer):
            c.close()
        self.cluster.stop()

    def step_in_background(self, version):
        self.source[...] = values(version)
        out = {}

        def run():
            try:
                out["result"] = self.ctl.step(version)
            except weightbeam.WeightbeamError as e:
                out["error"] = e
        t = threading.Thread(target=run)
        t.start()
        return t, out


class AckedPause(unittest.TestCase):
    def setUp(self):
        self.s = StagedSides()
        self.s.open(ack=True)

    def tearDown(self):
        self.s.close()

    def test_the_swap_waits_for_the_ack(self):
        s = self.s
        self.assertTrue(s.worker.watcher_name)
        for v in (1, 2):
            t, out = s.step_in_background(v)
            next_of(s.worker, "begin", v)
            time.sleep(0.5)  # paused: the agent must not have touched the live tensor
            np.testing.assert_array_equal(s.dest, values(v - 1) if v > 1 else 0)
            s.worker.ack(v)
            next_of(s.worker, "commit", v)
            t.join()
            self.assertNotIn("error", out)
            np.testing.assert_array_equal(s.dest, values(v))
            pauses = out["result"].replica_pauses
            self.assertEqual(len(pauses), 1)
            self.assertTrue(pauses[0].staged)
            self.assertLess(pauses[0].seconds, 0.4)  # the copy, not the 0.5 s wait

    def test_ack_without_watching_with_ack_is_refused(self):
        other = weightbeam.LocalSession(self.s.cluster.sockets["node"], "inference", rank=1)
        with self.assertRaises(weightbeam.WeightbeamError):
            other.ack(1)
        other.close()


class SwapByTheWorker(unittest.TestCase):
    def setUp(self):
        self.s = StagedSides()
        self.s.open(swap=True)

    def tearDown(self):
        self.s.close()

    def test_ready_then_the_worker_swaps(self):
        s = self.s
        t, out = s.step_in_background(1)
        ready = next_of(s.worker, "ready", 1)
        mine = [o for o in ready.staged if o.shm_name.lstrip("/") == s.wbuf.shm_name.lstrip("/")]
        self.assertEqual(len(mine), 1)
        time.sleep(0.3)
        # The agent copies nothing itself: the live tensor is untouched until we swap.
        np.testing.assert_array_equal(s.dest, 0)
        fd = os.open("/dev/shm/" + mine[0].staging_shm_name.lstrip("/"), os.O_RDONLY)
        try:
            with mmap.mmap(fd, mine[0].length, prot=mmap.PROT_READ) as m:
                staged = np.frombuffer(m, dtype=np.uint16, count=SHAPE[0] * SHAPE[1]).copy()
        finally:
            os.close(fd)
        s.dest[...] = staged.reshape(SHAPE)
        s.worker.ack(1)
        next_of(s.worker, "commit", 1)
        t.join()
        self.assertNotIn("error", out)
        np.testing.assert_array_equal(s.dest, values(1))

        # A failed swap: the replica is dropped from the step, naming the error.
        t, out = s.step_in_background(2)
        next_of(s.worker, "ready", 2)
        s.worker.ack(2, error="engine out of memory")
        abort = next_of(s.worker, "abort", 2)
        self.assertIn("engine out of memory", abort.reason)
        t.join()
        self.assertIn("error", out)
        self.assertIn("engine out of memory", str(out["error"]))
        # Told once: the controller's abort that follows adds no second abort(2).
        self.assertIsNone(s.worker.next_event(timeout=1.0))


if __name__ == "__main__":
    unittest.main()
