"""Instant rollback (issue 43), with real daemons: staged receivers that keep earlier versions
(receive.keep_versions) go back to any kept one with one local copy, every byte restored (and
compared here), announced to the watchers as commit(v) with the rollback as its reason. A
version not kept is refused, naming those kept, and nothing changes. The next push after a
rollback is correct, dense and in delta mode (the controller makes it an anchor)."""

import time
import unittest

import numpy as np

import weightbeam
from cluster import Cluster

SHAPE = (128, 256)
NBYTES = SHAPE[0] * SHAPE[1] * 2
NAMES = ("layer.0.weight", "layer.1.weight")
KEEP = "receive:\n  mode: staged\n  ack_timeout_ms: 3000\n  keep_versions: 3\n"


def values(version, i):
    n = SHAPE[0] * SHAPE[1]
    return ((np.arange(n, dtype=np.uint32) * 2654435761 + version * 7919 + i * 104729)
            >> 7).astype(np.uint16).reshape(SHAPE)


def next_of(session, kind, version, timeout=20, reason=""):
    """The next event of ``kind`` and ``version`` whose reason holds ``reason`` (the watcher
    also has the steps' own events queued)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        e = session.next_event(timeout=deadline - time.monotonic())
        if e is not None and e.kind == kind and e.version == version and reason in e.reason:
            return e
    raise AssertionError(f"no {kind} {version} within {timeout} s")


class Fleet:
    """A trainer node and two staged inference agents, one replica each, two BF16 tensors."""

    def __init__(self, delta):
        self.cluster = Cluster(["train", "ia", "ib"], trainer_ranks=1, inference_replicas=2,
                               agent_yaml=lambda name: KEEP if name != "train" else "")
        self.closing = []
        self.trainer = self.keep(weightbeam.LocalSession(self.cluster.sockets["train"],
                                                         "trainer", rank=0))
        tbuf = self.keep(weightbeam.SharedBuffer(2 * NBYTES, "trainer"))
        self.sources = [tbuf.array(np.uint16, SHAPE, i * NBYTES) for i in range(2)]
        for name, a in zip(NAMES, self.sources):
            self.trainer.register(name, "bf16", SHAPE, buffer=a)
        self.dests, self.workers = [], []
        for replica, agent in enumerate(("ia", "ib")):
            w = self.keep(weightbeam.LocalSession(self.cluster.sockets[agent], "inference",
                                                  rank=0, replica=replica))
            buf = self.keep(weightbeam.SharedBuffer(2 * NBYTES, f"w{replica}"))
            dests = [buf.array(np.uint16, SHAPE, i * NBYTES) for i in range(2)]
            for name, a in zip(NAMES, dests):
                w.register(name, "bf16", SHAPE, buffer=a)
            w.watch()
            self.workers.append(w)
            self.dests.append(dests)
        self.ctl = self.keep(weightbeam.ControllerClient(self.cluster.controller_address))
        self.ctl.plan(1, 2, 1, wait_s=30, delta=delta)

    def keep(self, c):
        self.closing.append(c)
        return c

    def push(self, version, like=None):
        for i, a in enumerate(self.sources):
            a[...] = values(version if like is None else like, i)
        return self.ctl.step(version)

    def holds(self, version):
        return all(np.array_equal(d, values(version, i))
                   for dests in self.dests for i, d in enumerate(dests))

    def close(self):
        for c in reversed(self.closing):
            c.close()
        self.cluster.stop()


class Rollback(unittest.TestCase):
    def run_case(self, delta):
        f = Fleet(delta)
        try:
            for v in (1, 2, 3):
                f.push(v)
                self.assertTrue(f.holds(v))
            # Back one version, then two: every byte of every replica, one local copy each.
            r = f.ctl.rollback(2)
            self.assertTrue(r.rollback and r.ok, r)
            self.assertEqual(sorted(r.committed_replicas), [0, 1])
            self.assertTrue(f.holds(2))
            for w in f.workers:
                next_of(w, "commit", 2, reason="rollback from version 3")
            self.assertTrue(f.ctl.rollback(1).ok)
            self.assertTrue(f.holds(1))
            status = {x.replica: x.committed_version for x in f.ctl.status().replicas}
            self.assertEqual(status, {0: 1, 1: 1})
            # Not kept: refused, naming what is, and nothing changes.
            with self.assertRaises(weightbeam.StepFailed) as e:
                f.ctl.rollback(7)
            self.assertIn("version 7 is not kept here (kept: ", str(e.exception))
            self.assertTrue(f.holds(1))
            # Forward again to a kept newer version, then on with the training.
            self.assertTrue(f.ctl.rollback(3).ok)
            self.assertTrue(f.holds(3))
            self.assertTrue(f.ctl.rollback(2).ok)
            r = f.push(4)
            self.assertTrue(f.holds(4), r)
            if delta:
                self.assertTrue(r.delta_anchor, "the push after a rollback must be dense")
                r = f.push(5)
                self.assertTrue(f.holds(5))
            # Only one replica back: the other keeps serving the newest version.
            self.assertTrue(f.ctl.rollback(3 if not delta else 4, replicas=[1]).ok)
            back = 3 if not delta else 4
            for i, d in enumerate(f.dests[1]):
                self.assertTrue(np.array_equal(d, values(back, i)))
            newest = 4 if not delta else 5
            for i, d in enumerate(f.dests[0]):
                self.assertTrue(np.array_equal(d, values(newest, i)))
        finally:
            f.close()

    def test_dense(self):
        self.run_case(delta=False)

    def test_delta(self):
        self.run_case(delta=True)


if __name__ == "__main__":
    unittest.main()
