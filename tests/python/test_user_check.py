"""A user check of every staged version (issue 43), with real daemons: a plan made with
``user_check`` has each receiving agent hand the staged bytes of a version to the check
watchers of the inference processes (LocalSession.check_versions) before it commits. The
checks see exactly the bytes the trainer sent; one replica's refusal, exception or missed
deadline aborts the version on every replica (the other replica's check passed, yet it keeps
serving the previous version), the trainer's step raises StepFailed naming the watcher and its
reason, and the next accepted version commits everywhere. A user with no check watcher, and
an agent that writes in place, refuse every version of such a plan."""

import threading
import time
import unittest

import numpy as np

import weightbeam
from cluster import Cluster

SHAPE = (32, 256)
NBYTES = SHAPE[0] * SHAPE[1] * 2
NAMES = ("layer.0.weight", "layer.1.weight")
STAGED = "receive:\n  mode: staged\n  ack_timeout_ms: 3000\n"
DEADLINE_S = 1.5


def values(version, i):
    n = SHAPE[0] * SHAPE[1]
    return ((np.arange(n, dtype=np.uint32) * 5 + version * 977 + i * 31) % 0x3F00 +
            0x0100).astype(np.uint16).reshape(SHAPE)


class Replica:
    """One inference process (its own agent), with a check driven by `verdicts`."""

    def __init__(self, cluster, agent, replica):
        self.session = weightbeam.LocalSession(cluster.sockets[agent], "inference", rank=0,
                                               replica=replica)
        self.buf = weightbeam.SharedBuffer(2 * NBYTES, f"r{replica}")
        self.dests = [self.buf.array(np.uint16, SHAPE, i * NBYTES) for i in range(2)]
        for name, a in zip(NAMES, self.dests):
            self.session.register(name, "bf16", SHAPE, buffer=a)
        self.verdicts = {}  # version -> what check() does: "ok", "refuse", "raise", "sleep"
        self.seen = {}      # version -> {name: copy of the staged bytes the check was shown}
        self.live_at_check = {}  # version -> the live bytes while the check ran
        self.name = f"smoke-test-replica-{replica}"

    def check(self, version, tensors):
        self.seen[version] = {n: np.array(a) for n, a in tensors.items()}
        self.live_at_check[version] = [np.array(d) for d in self.dests]
        action = self.verdicts.get(version, "ok")
        if action == "refuse":
            return f"smoke forward of version {version}: loss 12.5 above 4.0"
        if action == "raise":
            raise RuntimeError(f"forward pass crashed on version {version}")
        if action == "sleep":
            time.sleep(DEADLINE_S + 1.0)
        return None

    def holds(self, version):
        return all(np.array_equal(d, values(version, i)) for i, d in enumerate(self.dests))

    def close(self):
        self.session.close()
        self.buf.close()


class Fleet:
    def __init__(self, watch=(True, True), staged=True):
        yaml = (lambda name: STAGED if name != "train" else "") if staged else None
        self.cluster = Cluster(["train", "ia", "ib"], trainer_ranks=1, inference_replicas=2,
                               agent_yaml=yaml)
        self.trainer = weightbeam.LocalSession(self.cluster.sockets["train"], "trainer", rank=0)
        self.tbuf = weightbeam.SharedBuffer(2 * NBYTES, "trainer")
        self.sources = [self.tbuf.array(np.uint16, SHAPE, i * NBYTES) for i in range(2)]
        for name, a in zip(NAMES, self.sources):
            self.trainer.register(name, "bf16", SHAPE, buffer=a)
        self.replicas = [Replica(self.cluster, agent, k) for k, agent in enumerate(("ia", "ib"))]
        for r, w in zip(self.replicas, watch):
            if w:
                r.session.check_versions(r.check, watcher=r.name)
        self.ctl = weightbeam.ControllerClient(self.cluster.controller_address)
        summary = self.ctl.plan(1, 2, 1, wait_s=30, user_check=True,
                                user_check_deadline_s=DEADLINE_S)
        assert summary.checks.user, summary

    def push(self, version):
        for i, a in enumerate(self.sources):
            a[...] = values(version, i)
        return self.ctl.step(version)

    def close(self):
        self.ctl.close()
        for r in self.replicas:
            r.close()
        self.trainer.close()
        self.tbuf.close()
        self.cluster.stop()


class UserCheck(unittest.TestCase):
    def assert_refused(self, f, version, *words):
        with self.assertRaises(weightbeam.StepFailed) as e:
            f.push(version)
        message = str(e.exception)
        for w in words:
            self.assertIn(w, message)
        for r in f.replicas:  # neither replica serves it, though one replica's check passed
            self.assertTrue(r.holds(1), f"replica holds other bytes after: {message}")
        return message

    def test_a_refusal_on_one_replica_keeps_every_replica_on_the_previous_version(self):
        f = Fleet()
        try:
            self.assertTrue(f.push(1).ok)
            for r in f.replicas:
                self.assertTrue(r.holds(1))
                # The check saw the staged version, not the live one, and every byte of it.
                for i, name in enumerate(NAMES):
                    np.testing.assert_array_equal(r.seen[1][name], values(1, i))
                self.assertFalse(np.array_equal(r.live_at_check[1][0], values(1, 0)))
            a, b = f.replicas
            b.verdicts[2] = "refuse"
            self.assert_refused(f, 2, "smoke-test-replica-1", "loss 12.5 above 4.0")
            self.assertIn(2, a.seen)  # replica 0 was checked and passed: still not live
            a.verdicts[3] = "raise"
            self.assert_refused(f, 3, "smoke-test-replica-0",
                                "RuntimeError: forward pass crashed on version 3")
            b.verdicts[4] = "sleep"
            self.assert_refused(f, 4, "smoke-test-replica-1", "user_deadline_ms")
            time.sleep(DEADLINE_S + 1.2)  # the slow check finishes and answers late
            r = f.push(5)
            self.assertTrue(r.ok)
            for rep in f.replicas:
                self.assertTrue(rep.holds(5))
                np.testing.assert_array_equal(rep.seen[5][NAMES[1]], values(5, 1))
        finally:
            f.close()

    def test_a_replica_without_a_check_watcher_refuses_every_version(self):
        f = Fleet(watch=(True, False))
        try:
            with self.assertRaises(weightbeam.StepFailed) as e:
                f.push(1)
            self.assertIn("no check watcher", str(e.exception))
            self.assertFalse(f.replicas[0].holds(1))
            f.replicas[1].session.check_versions(f.replicas[1].check, watcher="late")
            self.assertTrue(f.push(2).ok)
            self.assertTrue(all(np.array_equal(d, values(2, i))
                                for r in f.replicas for i, d in enumerate(r.dests)))
        finally:
            f.close()

    def test_in_place_agents_refuse_a_user_check(self):
        f = Fleet(watch=(False, False), staged=False)
        try:
            with self.assertRaises(weightbeam.StepFailed) as e:
                f.push(1)
            self.assertIn("receive.mode staged", str(e.exception))
        finally:
            f.close()

    def test_check_watch_needs_a_staged_agent(self):
        cluster = Cluster(["ia"], trainer_ranks=0, inference_replicas=1)
        try:
            s = weightbeam.LocalSession(cluster.sockets["ia"], "inference", rank=0)
            with self.assertRaises(weightbeam.WeightbeamError) as e:
                s.check_versions(lambda v, t: None)
            self.assertIn("receive.mode staged", str(e.exception))
            s.close()
        finally:
            cluster.stop()


if __name__ == "__main__":
    unittest.main()
