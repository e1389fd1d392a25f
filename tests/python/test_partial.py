"""Frozen tensors and partial steps (issue 43), with real daemons: a step that names the tensors
it changed runs only their ops (a step changing 10 % of the tensors costs at most 12 % of a
dense step's ops and bytes, and a tensor changed but not named really stays as it was on the
inference side); frozen tensors go with the plan's first step only; a replica that does not
hold the last version (rolled back here) makes the step run whole; delta plans refuse partial
steps, naming why."""

import unittest

import numpy as np

import weightbeam
from cluster import Cluster

TENSORS = 20
SHAPE = (64, 256)
NBYTES = SHAPE[0] * SHAPE[1] * 2
STAGED = "receive:\n  mode: staged\n  keep_versions: 2\n"


def values(version, i):
    n = SHAPE[0] * SHAPE[1]
    return ((np.arange(n, dtype=np.uint32) * 40503 + version * 7919 + i * 104729)
            >> 5).astype(np.uint16).reshape(SHAPE)


class Fleet:
    def __init__(self, **plan):
        self.cluster = Cluster(["train", "infer"], trainer_ranks=1,
                               agent_yaml=lambda name: STAGED if name == "infer" else "")
        self.closing = []
        self.trainer = self.keep(weightbeam.LocalSession(self.cluster.sockets["train"],
                                                         "trainer", rank=0))
        tbuf = self.keep(weightbeam.SharedBuffer(TENSORS * NBYTES, "trainer"))
        self.sources = [tbuf.array(np.uint16, SHAPE, i * NBYTES) for i in range(TENSORS)]
        worker = self.keep(weightbeam.LocalSession(self.cluster.sockets["infer"], "inference",
                                                   rank=0, replica=0))
        wbuf = self.keep(weightbeam.SharedBuffer(TENSORS * NBYTES, "worker"))
        self.dests = [wbuf.array(np.uint16, SHAPE, i * NBYTES) for i in range(TENSORS)]
        for i in range(TENSORS):
            self.trainer.register(f"layer.{i}.weight", "bf16", SHAPE, buffer=self.sources[i])
            worker.register(f"layer.{i}.weight", "bf16", SHAPE, buffer=self.dests[i])
        self.ctl = self.keep(weightbeam.ControllerClient(self.cluster.controller_address))
        self.ctl.plan(1, 1, 1, wait_s=30, **plan)

    def keep(self, c):
        self.closing.append(c)
        return c

    def set(self, version, tensors):
        for i in tensors:
            self.sources[i][...] = values(version, i)

    def holds(self, i, version):
        return np.array_equal(self.dests[i], values(version, i))

    def close(self):
        for c in reversed(self.closing):
            c.close()
        self.cluster.stop()


def cost(result):
    return sum(a.ops for a in result.agents), result.bytes


class PartialSteps(unittest.TestCase):
    def test_changed_tensors_only(self):
        f = Fleet()
        try:
            f.set(1, range(TENSORS))
            dense_ops, dense_bytes = cost(f.ctl.step(1))
            self.assertEqual(dense_bytes, TENSORS * NBYTES)
            # 10 % changed and named; tensor 5 changed too but not named.
            f.set(2, [0, 1, 5])
            r = f.ctl.step(2, changed=["layer.0.*", "layer.1.weight"])
            ops, sent = cost(r)
            self.assertTrue(r.partial.startswith("partial: 2 changed"), r.partial)
            self.assertLessEqual(ops, 0.12 * dense_ops, (ops, dense_ops))
            self.assertLessEqual(sent, 0.12 * dense_bytes, (sent, dense_bytes))
            self.assertEqual(sent, 2 * NBYTES)
            self.assertTrue(f.holds(0, 2) and f.holds(1, 2))
            self.assertTrue(f.holds(5, 1), "a tensor not named must not be sent")
            for i in range(2, TENSORS):
                if i != 5:
                    self.assertTrue(f.holds(i, 1))
            # A replica that does not hold the last version needs every tensor: whole.
            self.assertTrue(f.ctl.rollback(1).ok)
            f.set(3, range(TENSORS))
            r = f.ctl.step(3, changed=["layer.0.*"])
            self.assertTrue(r.partial.startswith("whole: replica 0 holds version 1"), r.partial)
            self.assertEqual(cost(r), (dense_ops, dense_bytes))
            self.assertTrue(all(f.holds(i, 3) for i in range(TENSORS)))
        finally:
            f.close()

    def test_frozen_tensors_go_once(self):
        f = Fleet(frozen=["layer.1[0-9].weight"])  # tensors 10..19: half
        try:
            f.set(1, range(TENSORS))
            dense_ops, dense_bytes = cost(f.ctl.step(1))
            self.assertEqual(dense_bytes, TENSORS * NBYTES)
            self.assertTrue(all(f.holds(i, 1) for i in range(TENSORS)))
            f.set(2, range(TENSORS))  # the "frozen" ones changed anyway: they stay unsent
            r = f.ctl.step(2)
            self.assertEqual(r.partial, "partial: 1 frozen pattern(s) skipped")
            self.assertEqual(cost(r)[1], 10 * NBYTES)
            self.assertTrue(all(f.holds(i, 2) for i in range(10)))
            self.assertTrue(all(f.holds(i, 1) for i in range(10, TENSORS)))
        finally:
            f.close()

    def test_delta_plans_refuse_partial_steps(self):
        f = Fleet(delta=True)
        try:
            f.set(1, range(TENSORS))
            f.ctl.step(1)
            with self.assertRaises(weightbeam.StepFailed) as e:
                f.ctl.step(2, changed=["layer.0.*"])
            self.assertIn("partial steps need a dense plan without relays", str(e.exception))
            self.assertTrue(f.ctl.step(2).ok)  # whole, as the error says
            with self.assertRaises(weightbeam.WeightbeamError) as e:
                f.ctl.plan(1, 1, 1, wait_s=30, delta=True, frozen=["layer.1.*"])
            self.assertIn("frozen tensors need a dense plan without relays", str(e.exception))
        finally:
            f.close()


if __name__ == "__main__":
    unittest.main()
