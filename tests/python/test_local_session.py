"""The Python LocalSession against a real wb-agent (and wb-controller): registrations the
controller then lists, the agent's refusals word for word, unregister and close withdrawing."""

import unittest

import numpy as np

import weightbeam
from weightbeam import cuda_ipc
from cluster import Cluster, wait_until


class LocalSessionTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(["node-a"], trainer_ranks=1)
        cls.socket = cls.cluster.sockets["node-a"]
        cls.ctl = weightbeam.ControllerClient(cls.cluster.controller_address)

    @classmethod
    def tearDownClass(cls):
        cls.ctl.close()
        cls.cluster.stop()

    def setUp(self):
        self.buf = weightbeam.SharedBuffer(1 << 20, "test")
        self.session = weightbeam.LocalSession(self.socket, "trainer", rank=0)

    def tearDown(self):
        self.session.close()
        self.buf.close()
        wait_until(lambda: not self.listed(), 10, "the agent to withdraw the session's tensors")

    def listed(self):
        """{name: TensorLayout} the controller lists for node-a."""
        layouts = self.ctl.list_tensors("node-a")
        return {t.spec.name: t for layout in layouts for t in layout.tensors}

    def test_registered_tensors_are_listed_by_the_controller(self):
        w = self.buf.array(np.uint16, (64, 32), offset=0)  # BF16 held as uint16
        b = self.buf.array(np.float32, (32,), offset=w.nbytes)
        self.session.register("model.w", "bf16", (128, 32), shard=[(64, 64), (0, 32)], buffer=w)
        layout = self.session.register("model.b", np.float32, (32,), buffer=b)
        self.assertEqual(layout.spec.name, "model.b")
        self.assertEqual(layout.region.length, 32 * 4)

        wait_until(lambda: len(self.listed()) == 2, 10, "the controller to list both tensors")
        listed = self.listed()
        spec = listed["model.w"].spec
        self.assertEqual(spec.dtype, weightbeam.local_session.types_pb2.DTYPE_BF16)
        self.assertEqual(list(spec.global_shape), [128, 32])
        self.assertEqual([(s.start, s.size) for s in spec.shard], [(64, 64), (0, 32)])
        self.assertEqual(listed["model.w"].location, "host")
        self.assertEqual(listed["model.w"].owner.role,
                         weightbeam.local_session.types_pb2.ROLE_TRAINER)
        self.assertEqual(listed["model.b"].spec.dtype,
                         weightbeam.local_session.types_pb2.DTYPE_F32)

    def test_a_shape_that_does_not_match_the_memory_gives_the_agents_message(self):
        small = self.buf.array(np.uint16, (16,))
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            self.session.register("bad", "bf16", (4, 8), buffer=small)
        self.assertEqual(
            str(caught.exception),
            "tensor 'bad': shape [4, 8] of bf16 needs 64 bytes but the memory handle covers 32")
        self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")

    def test_a_shard_outside_the_tensor_gives_the_agents_message(self):
        view = self.buf.array(np.uint16, (8,))
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            self.session.register("edge", "bf16", (10,), shard=[(4, 8)], buffer=view)
        self.assertEqual(str(caught.exception),
                         "tensor 'edge': shard slice [4, 12) of dimension 0 is outside the global "
                         "extent 10")

    def test_the_session_stays_usable_after_a_refusal(self):
        view = self.buf.array(np.float32, (4,))
        with self.assertRaises(weightbeam.WeightbeamError):
            self.session.register("x", "f32", (5,), buffer=view)
        self.session.register("x", "f32", (4,), buffer=view)
        wait_until(lambda: "x" in self.listed(), 10, "the controller to list x")

    def test_unregister_and_close_withdraw_tensors(self):
        a = self.buf.array(np.int32, (8,))
        self.session.register("a", "i32", (8,), buffer=a)
        self.session.register("b", "u8", (100,), buffer=self.buf, offset=4096)  # raw buffer range
        wait_until(lambda: set(self.listed()) == {"a", "b"}, 10, "both tensors listed")
        self.session.unregister("a")
        wait_until(lambda: set(self.listed()) == {"b"}, 10, "a to be withdrawn")
        self.session.close()
        wait_until(lambda: not self.listed(), 10, "b to go with the session")
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            self.session.register("c", "u8", (1,), buffer=self.buf)
        self.assertEqual(str(caught.exception), "the session is closed")

    def test_unregistering_an_unknown_name_gives_the_agents_message(self):
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            self.session.unregister("never-registered")
        self.assertIn("never-registered", str(caught.exception))

    def test_memory_outside_shared_memory_is_refused_before_the_agent(self):
        private = np.zeros(16, dtype=np.float32)
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            self.session.register("private", "f32", (16,), buffer=private)
        self.assertIn("not in a weightbeam SharedBuffer", str(caught.exception))

    @unittest.skipIf(cuda_ipc.available(), "this machine has CUDA")
    def test_cuda_registration_without_cuda_says_so(self):
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            self.session.register_cuda("g", "bf16", (4,), device_ptr=0x1000, length=8)
        self.assertTrue(str(caught.exception).startswith("CUDA not available"),
                        str(caught.exception))

    def test_no_agent_on_the_socket(self):
        with self.assertRaises(weightbeam.WeightbeamError) as caught:
            weightbeam.LocalSession(self.cluster.dir + "/none.sock", "trainer",
                                    connect_timeout=0.5)
        self.assertEqual(str(caught.exception),
                         f"no wb-agent answers on {self.cluster.dir}/none.sock (is it running?)")


if __name__ == "__main__":
    unittest.main()
