"""Agents fence controllers by leader epoch (issue 45), with a real wb-agent: a call carrying
the metadata "wb-leader-epoch" raises the epoch the agent follows; a call from an older epoch
is refused naming both epochs, one without an epoch once an epoch was seen is refused too, and
a newer epoch takes over. A plain controller (no epoch) drives an agent that never saw one
(every other test)."""

import re
import unittest

import grpc

from cluster import Cluster

DESCRIBE = "/weightbeam.v1.Agent/Describe"  # an empty DescribeRequest is zero bytes


class LeaderFence(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(["ia"], trainer_ranks=0, inference_replicas=1)
        with open(self.cluster._path("ia.yaml")) as f:
            endpoint = re.search(r"^listen: (\S+)", f.read(), re.M).group(1)
        self.channel = grpc.insecure_channel(endpoint)
        self.describe = self.channel.unary_unary(DESCRIBE, request_serializer=lambda b: b,
                                                 response_deserializer=lambda b: b)

    def tearDown(self):
        self.channel.close()
        self.cluster.stop()

    def call(self, epoch=None):
        md = () if epoch is None else (("wb-leader-epoch", str(epoch)),)
        return self.describe(b"", metadata=md, timeout=10)

    def refused(self, epoch):
        with self.assertRaises(grpc.RpcError) as e:
            self.call(epoch)
        return e.exception

    def test_an_older_epoch_is_refused_naming_both(self):
        self.assertIsInstance(self.call(), bytes)  # no epoch seen yet: admitted
        self.assertIsInstance(self.call(5), bytes)
        old = self.refused(3)
        self.assertEqual(old.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("Agent.Describe from leader epoch 3 refused", old.details())
        self.assertIn("newer leader epoch 5", old.details())
        none = self.refused(None)
        self.assertEqual(none.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("carries no leader epoch", none.details())
        bad = self.refused("five")
        self.assertEqual(bad.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIsInstance(self.call(5), bytes)  # the same leader again
        self.assertIsInstance(self.call(9), bytes)  # a newer leader takes over
        self.assertIn("newer leader epoch 9", self.refused(5).details())
        self.assertIn("following controller leader epoch 9", self.cluster.log("ia"))


if __name__ == "__main__":
    unittest.main()
