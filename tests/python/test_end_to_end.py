"""A Python trainer (two FSDP ranks) and a Python inference worker on real agents (two nodes
over tcp, or one node): plan, step, and the worker's NumPy arrays hold the trainers' bytes (BF16
copy, BF16 -> F32 cast, BF16 -> FP8 e4m3 with 128x128 block scales checked against an
independent NumPy quantiser), also in engine-style fused buffers registered as parts (views)."""

import unittest

import numpy as np

import weightbeam
from cluster import Cluster, wait_until
from fp8_reference import quantize_fp8_blocks

# name: (global shape, destination dtype)
TENSORS = {
    "layers.0.w": ((256, 384), "bf16"),
    "layers.1.w": ((128, 256), "f32"),
    "layers.2.w": ((256, 200), "f8_e4m3"),
    "layers.3.q": ((128, 64), "bf16"),
    "layers.3.k": ((64, 64), "bf16"),
    "layers.4.a": ((256, 128), "f8_e4m3"),
    "layers.4.b": ((256, 128), "f8_e4m3"),
}
# Engine-style fused buffers on the worker: each source lands whole at a row offset of one
# shared-memory range (two parts, one buffer); rows past the parts are padding nobody writes.
VIEWS = {
    "layers.3.qk_proj": ("bf16", (200, 64), {"layers.3.q": 0, "layers.3.k": 128}),
    "layers.4.ab_proj": ("f8_e4m3", (512, 128), {"layers.4.a": 0, "layers.4.b": 256}),
}
PADDING = 0xEE
TRAINERS = 2
NP_TYPES = {"bf16": np.uint16, "f32": np.float32, "f8_e4m3": np.uint8}


def random_bf16(rng, shape):
    """BF16 bit patterns of normal samples (no NaN/Inf), as uint16."""
    return (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def align(n):
    return (n + 63) // 64 * 64


class TensorLike:
    """What the client sees of a host torch tensor built with torch.frombuffer on a SharedBuffer:
    data_ptr(), nbytes, is_contiguous(), is_cuda (torch is not installed here)."""

    def __init__(self, array):
        self.array = array
        self.nbytes = array.nbytes
        self.is_cuda = False

    def data_ptr(self):
        return self.array.__array_interface__["data"][0]

    def is_contiguous(self):
        return self.array.flags["C_CONTIGUOUS"]


class Trainer:
    """One trainer rank: dim-0 shard of every tensor, BF16, in one SharedBuffer."""

    def __init__(self, socket, rank, wrap=lambda view: view):
        self.rank = rank
        self.session = weightbeam.LocalSession(socket, "trainer", rank=rank)
        self.shards = {}
        sizes = {}
        for name, (shape, _) in TENSORS.items():
            rows = shape[0] // TRAINERS
            sizes[name] = align(rows * shape[1] * 2)
        self.buffer = weightbeam.SharedBuffer(sum(sizes.values()), f"trainer{rank}")
        offset = 0
        for name, (shape, _) in TENSORS.items():
            rows = shape[0] // TRAINERS
            view = self.buffer.array(np.uint16, (rows, shape[1]), offset)
            self.session.register(name, "bf16", shape, shard=[(rank * rows, rows), (0, shape[1])],
                                  buffer=wrap(view))
            self.shards[name] = view
            offset += sizes[name]

    def close(self):
        self.session.close()
        self.buffer.close()


class Worker:
    """The inference replica's only rank: every tensor full, in its destination dtype."""

    def __init__(self, socket):
        self.session = weightbeam.LocalSession(socket, "inference", rank=0, replica=0)
        self.arrays = {}
        layout = []
        parts = {name for _, _, placed in VIEWS.values() for name in placed}
        for name, (shape, dtype) in TENSORS.items():
            if name in parts:
                continue
            layout.append((name, shape, dtype))
            if dtype == "f8_e4m3":
                layout.append((name + "_scale_inv", tuple((d + 127) // 128 for d in shape), "f32"))
        nbytes = [align(int(np.prod(s)) * np.dtype(NP_TYPES[d]).itemsize) for _, s, d in layout]
        self.buffer = weightbeam.SharedBuffer(sum(nbytes), "worker")
        offset = 0
        for (name, shape, dtype), n in zip(layout, nbytes):
            view = self.buffer.array(NP_TYPES[dtype], shape, offset)
            self.session.register(name, dtype, shape, buffer=view)
            self.arrays[name] = view
            offset += n
        self.fused = {}
        self.fused_buffers = [self.register_fused(name, *spec) for name, spec in VIEWS.items()]

    def register_fused(self, name, dtype, shape, placed):
        """One buffer (and, for FP8, its scale buffer) filled by parts, as an engine holds it."""
        buffers = [(name, dtype, shape)]
        if dtype == "f8_e4m3":
            buffers.append((name + "_scale_inv", "f32", tuple((d + 127) // 128 for d in shape)))
        nbytes = [align(int(np.prod(s)) * np.dtype(NP_TYPES[d]).itemsize) for _, d, s in buffers]
        shm = weightbeam.SharedBuffer(sum(nbytes), name.replace(".", "-"))
        offset = 0
        for (bname, bdtype, bshape), n in zip(buffers, nbytes):
            array = shm.array(NP_TYPES[bdtype], bshape, offset)
            array.view(np.uint8)[...] = PADDING
            self.fused[bname] = array
            scale = bname != name
            for src, row in placed.items():
                rows, cols = TENSORS[src][0]
                part, at = (src, row)
                if scale:
                    part, at = src + "_scale_inv", row // 128
                    rows, cols = (rows + 127) // 128, (cols + 127) // 128
                self.session.register(part, bdtype, (rows, cols), buffer=shm, offset=offset,
                                      length=array.nbytes, view=(bshape, (at, 0), bname))
            offset += n
        return shm

    def close(self):
        self.session.close()
        self.buffer.close()
        for shm in self.fused_buffers:
            shm.close()


class TwoNodes(unittest.TestCase):
    """Trainers on one agent, the worker on another: the bytes cross tcp."""
    TRAINER_NODE, INFERENCE_NODE = "trainer-node", "inference-node"
    WRAP = staticmethod(lambda view: view)  # trainers register NumPy views

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(sorted({cls.TRAINER_NODE, cls.INFERENCE_NODE}),
                              trainer_ranks=TRAINERS)
        cls.trainers = [Trainer(cls.cluster.sockets[cls.TRAINER_NODE], r, cls.WRAP)
                        for r in range(TRAINERS)]
        cls.worker = Worker(cls.cluster.sockets[cls.INFERENCE_NODE])
        cls.worker.session.watch()
        cls.ctl = weightbeam.ControllerClient(cls.cluster.controller_address)
        cls.rng = np.random.default_rng(7)

    @classmethod
    def tearDownClass(cls):
        cls.ctl.close()
        for t in cls.trainers:
            t.close()
        cls.worker.close()
        cls.cluster.stop()

    def source(self, name):
        return np.concatenate([t.shards[name] for t in self.trainers])

    def train_step(self, fraction=1.0):
        """What an optimizer step does to the weights: new values in place (in `fraction` of
        the elements)."""
        for t in self.trainers:
            for name, shard in t.shards.items():
                fresh = random_bf16(self.rng, shard.shape)
                if fraction >= 1.0:
                    shard[...] = fresh
                else:
                    picked = self.rng.random(shard.shape) < fraction
                    shard[picked] = fresh[picked]

    def assert_worker_holds_sources(self):
        got = self.worker.arrays
        np.testing.assert_array_equal(got["layers.0.w"], self.source("layers.0.w"))
        np.testing.assert_array_equal(got["layers.1.w"], bf16_to_f32(self.source("layers.1.w")))
        want_q, want_scales = quantize_fp8_blocks(bf16_to_f32(self.source("layers.2.w")))
        np.testing.assert_array_equal(got["layers.2.w_scale_inv"], want_scales)
        np.testing.assert_array_equal(got["layers.2.w"], want_q)
        fused = self.worker.fused
        qk = np.concatenate([self.source("layers.3.q"), self.source("layers.3.k")])
        np.testing.assert_array_equal(fused["layers.3.qk_proj"][:192], qk)
        self.assertTrue((fused["layers.3.qk_proj"][192:] == PADDING * 0x101).all())
        ab = np.concatenate([self.source("layers.4.a"), self.source("layers.4.b")])
        want_q, want_scales = quantize_fp8_blocks(bf16_to_f32(ab))
        np.testing.assert_array_equal(fused["layers.4.ab_proj_scale_inv"], want_scales)
        np.testing.assert_array_equal(fused["layers.4.ab_proj"], want_q)

    def next_events(self, count):
        events = []
        for _ in range(count):
            e = self.worker.session.next_event(timeout=30)
            self.assertIsNotNone(e, f"no event after {events}")
            events.append((e.kind, e.version))
        return events

    def test_steps_land_the_trainers_bytes_and_failed_steps_raise(self):
        summary = self.ctl.plan(TRAINERS, 1, 1, wait_s=30)
        self.assertGreater(summary.total_ops, 0)

        for version in (1, 2):
            self.train_step()
            # max_staleness (docs/elastic.md): no replica is left out, so it never waits.
            result = self.ctl.step(version, max_staleness=0 if version == 2 else None)
            self.assertTrue(result.ok)
            self.assertEqual(result.version, version)
            self.assertEqual(list(result.committed_replicas), [0])
            self.assertGreater(result.bytes, 0)
            self.assert_worker_holds_sources()
            self.assertEqual(self.next_events(2), [("begin", version), ("commit", version)])

        with self.assertRaises(weightbeam.StepFailed) as caught:
            self.ctl.step(2)
        self.assertEqual(str(caught.exception),
                         "version 2 is not newer than the last committed version 2")
        self.assertFalse(caught.exception.result.ok)
        self.assertEqual(self.ctl.status().last_committed_version, 2)

        # Delta mode for this plan: an anchor step, then a step that changes ~1% of the
        # elements ships only those, and the worker still holds every byte.
        summary = self.ctl.plan(TRAINERS, 1, 1, wait_s=30, delta=True)
        self.assertTrue(summary.delta.enabled)
        for version, sparse in ((3, False), (4, True)):
            self.train_step(fraction=0.01 if sparse else 1.0)
            result = self.ctl.step(version)
            self.assertEqual(result.delta_anchor, not sparse)
            self.assertGreater(result.bytes_dense, 0)
            if sparse:
                self.assertGreater(result.delta_ops, 0)
                self.assertLess(result.bytes * 5, result.bytes_dense)
            else:
                self.assertEqual(result.bytes, result.bytes_dense)
            self.assert_worker_holds_sources()
            self.assertEqual(self.next_events(2), [("begin", version), ("commit", version)])

        # A trainer withdraws a shard; once the controller knows, the next step cannot be
        # planned and the error says why.
        self.trainers[1].session.unregister("layers.0.w")
        wait_until(lambda: not self.held_by_trainer(1, "layers.0.w"), 10,
                   "the controller to see the shard withdrawn")
        with self.assertRaises(weightbeam.StepFailed) as caught:
            self.ctl.step(5)
        message = str(caught.exception)
        self.assertTrue(message.startswith("cannot plan: "), message)
        self.assertIn("layers.0.w [256, 384] among the trainers leave holes: rows [128, 256) held "
                      "by no rank", message)

    def held_by_trainer(self, rank, name):
        trainer = weightbeam.local_session.types_pb2.ROLE_TRAINER
        return any(t.spec.name == name and t.owner.role == trainer and t.owner.rank == rank
                   for layout in self.ctl.list_tensors(self.TRAINER_NODE) for t in layout.tensors)


class OneNode(TwoNodes):
    """Trainers and worker on the same agent (local copies); the trainers register tensor-like
    objects (data_ptr/nbytes), as a PyTorch loop would."""
    TRAINER_NODE = INFERENCE_NODE = "node"
    WRAP = staticmethod(TensorLike)


if __name__ == "__main__":
    unittest.main()
