"""Versions checked before they go live (issue 43), with real daemons: a plan made with
``check_finite`` has every receiver scan each version's received bytes before it commits. A
version with one NaN (or Inf) in one tensor is committed nowhere, the trainer's step raises
StepFailed naming that tensor, and a staged receiver's live tensors keep the previous version;
the next clean version commits. In place, the version is refused the same way (its bytes were
written in place: the engine is never told commit(v)). A plan made with ``digest`` has every
committed replica report a digest of what it holds: the same on every replica of a version,
another for other bytes, the first again for the first version's bytes."""

import time
import unittest

import numpy as np

import weightbeam
from cluster import Cluster

SHAPE = (64, 128)
NBYTES = SHAPE[0] * SHAPE[1] * 2
NAMES = ("layer.0.weight", "layer.1.weight")
STAGED = "receive:\n  mode: staged\n  ack_timeout_ms: 3000\n"
BF16_NAN, BF16_INF = 0x7FC1, 0x7F80


def values(version, i):
    """Finite BF16 bits (exponent well below all-ones) that differ per version and tensor."""
    n = SHAPE[0] * SHAPE[1]
    return ((np.arange(n, dtype=np.uint32) * 7 + version * 131 + i * 17) % 0x3F00 +
            0x0100).astype(np.uint16).reshape(SHAPE)


class Fleet:
    """A trainer node and an inference node (two replicas, staged or in place), one buffer
    with two BF16 tensors on each side, planned with check_finite."""

    def __init__(self, staged, delta=False):
        yaml = (lambda name: STAGED if name == "infer" else "") if staged else None
        self.cluster = Cluster(["train", "infer"], trainer_ranks=1, inference_replicas=2,
                               agent_yaml=yaml)
        self.trainer = weightbeam.LocalSession(self.cluster.sockets["train"], "trainer", rank=0)
        self.tbuf = weightbeam.SharedBuffer(2 * NBYTES, "trainer")
        self.sources = [self.tbuf.array(np.uint16, SHAPE, i * NBYTES) for i in range(2)]
        for name, a in zip(NAMES, self.sources):
            self.trainer.register(name, "bf16", SHAPE, buffer=a)
        self.workers, self.dests, self.wbufs = [], [], []
        for replica in range(2):
            w = weightbeam.LocalSession(self.cluster.sockets["infer"], "inference", rank=0,
                                        replica=replica)
            buf = weightbeam.SharedBuffer(2 * NBYTES, f"worker{replica}")
            dests = [buf.array(np.uint16, SHAPE, i * NBYTES) for i in range(2)]
            for name, a in zip(NAMES, dests):
                w.register(name, "bf16", SHAPE, buffer=a)
            self.workers.append(w)
            self.wbufs.append(buf)
            self.dests.append(dests)
        self.ctl = weightbeam.ControllerClient(self.cluster.controller_address)
        summary = self.ctl.plan(1, 2, 1, wait_s=30, delta=delta, check_finite=True)
        assert summary.checks.finite, summary

    def fill(self, version):
        for i, a in enumerate(self.sources):
            a[...] = values(version, i)

    def holds(self, version):
        return all(np.array_equal(d, values(version, i))
                   for dests in self.dests for i, d in enumerate(dests))

    def close(self):
        self.ctl.close()
        for w in self.workers:
            w.close()
        self.trainer.close()
        self.cluster.stop()


class FiniteCheck(unittest.TestCase):
    def run_case(self, staged, delta=False):
        f = Fleet(staged, delta)
        try:
            f.fill(1)
            self.assertTrue(f.ctl.step(1).ok)
            self.assertTrue(f.holds(1))
            for version, bits, row, col in ((2, BF16_NAN, 17, 5), (3, BF16_INF, 63, 127)):
                f.fill(version)
                f.sources[1][row, col] = bits
                with self.assertRaises(weightbeam.StepFailed) as e:
                    f.ctl.step(version)
                message = str(e.exception)
                self.assertIn("tensor 'layer.1.weight'", message)
                self.assertIn(f"non-finite value at element {row * SHAPE[1] + col}", message)
                self.assertIn(f"0x{bits:04x}", message)
                if staged:  # never live: every byte of both replicas is still version 1's
                    self.assertTrue(f.holds(1), f"{message}")
            f.fill(4)
            self.assertTrue(f.ctl.step(4).ok)
            self.assertTrue(f.holds(4))
        finally:
            f.close()

    def test_staged_nan_and_inf_never_go_live(self):
        self.run_case(staged=True)

    def test_staged_delta_nan_never_goes_live(self):
        self.run_case(staged=True, delta=True)

    def test_in_place_nan_is_refused(self):
        self.run_case(staged=False)


class Digest(unittest.TestCase):
    def test_replicas_on_two_agents_report_one_digest_per_version(self):
        cluster = Cluster(["train", "ia", "ib"], trainer_ranks=1, inference_replicas=2)
        closing = []
        try:
            trainer = weightbeam.LocalSession(cluster.sockets["train"], "trainer", rank=0)
            tbuf = weightbeam.SharedBuffer(2 * NBYTES, "trainer")
            closing += [trainer, tbuf]
            sources = [tbuf.array(np.uint16, SHAPE, i * NBYTES) for i in range(2)]
            for name, a in zip(NAMES, sources):
                trainer.register(name, "bf16", SHAPE, buffer=a)
            for replica, agent in enumerate(("ia", "ib")):
                w = weightbeam.LocalSession(cluster.sockets[agent], "inference", rank=0,
                                            replica=replica)
                buf = weightbeam.SharedBuffer(2 * NBYTES, f"w{replica}")
                closing += [w, buf]
                for i, name in enumerate(NAMES):
                    w.register(name, "bf16", SHAPE, buffer=buf.array(np.uint16, SHAPE,
                                                                     i * NBYTES))
            ctl = weightbeam.ControllerClient(cluster.controller_address)
            closing.append(ctl)
            watcher = weightbeam.LocalSession(cluster.sockets["ib"], "inference", rank=1,
                                              replica=1)
            closing.append(watcher)
            watcher.watch()
            self.assertTrue(ctl.plan(1, 2, 1, wait_s=30, digest=True).checks.digest)
            digests = {}
            for version, like in ((1, 1), (2, 2), (3, 1)):
                for i, a in enumerate(sources):
                    a[...] = values(like, i)
                r = ctl.step(version)
                per_replica = {d.replica: d.digest for d in r.replica_digests}
                self.assertEqual(sorted(per_replica), [0, 1], r)
                self.assertEqual(len(set(per_replica.values())), 1, r)
                self.assertEqual(r.digest, per_replica[0])
                self.assertRegex(r.digest, "^[0-9a-f]{16}$")
                digests[version] = r.digest
                # The engine side hears the digest with commit(v): what it serves, by name.
                e = watcher.next_event(timeout=10)
                while e is not None and not (e.kind == "commit" and e.version == version):
                    e = watcher.next_event(timeout=10)
                self.assertIsNotNone(e)
                self.assertEqual(e.digests, per_replica)
                status = {x.replica: x for x in ctl.status().replicas}
                self.assertEqual(status[0].digest, r.digest)
                self.assertEqual(status[1].committed_version, version)
            self.assertNotEqual(digests[1], digests[2])
            self.assertEqual(digests[1], digests[3])  # the same bytes, the same identity
        finally:
            for c in reversed(closing):
                c.close()
            cluster.stop()


if __name__ == "__main__":
    unittest.main()
