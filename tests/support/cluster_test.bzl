"""Tests and benchmarks that start real wb-controller / wb-agent processes (tests/support/cluster.h)."""

load("//tools:catch2.bzl", "catch2_test")

# The daemons a Cluster starts, as runfiles.
DAEMONS = [
    "//controller:wb-controller",
    "//daemon:wb-agent",
]

# The client library and the Cluster harness.
CLUSTER_DEPS = [
    "//client:weightbeam",
    "//tests/support:cluster",
]

def cluster_test(name, data = [], deps = [], **kwargs):
    """A Catch2 test `name` with the daemons, the Cluster harness and the one-tensor fixture."""
    catch2_test(
        name = name,
        data = DAEMONS + data,
        deps = CLUSTER_DEPS + ["//tests/support:one_tensor"] + deps,
        **kwargs
    )
