"""The generated protobuf / gRPC modules (package ``weightbeam.v1``), with a clear error when they
have not been generated: run client/python/gen_stubs.sh, or put Bazel's
bazel-bin/client/python on PYTHONPATH after ``bazel build //client/python:stubs``."""

try:
    from weightbeam.v1 import controller_pb2, controller_pb2_grpc
    from weightbeam.v1 import local_pb2, local_pb2_grpc
    from weightbeam.v1 import types_pb2
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "weightbeam: the generated stubs (weightbeam.v1.*_pb2) are missing; run "
        "client/python/gen_stubs.sh or add bazel-bin/client/python to PYTHONPATH after "
        f"'bazel build //client/python:stubs' ({e})") from e

__all__ = ["controller_pb2", "controller_pb2_grpc", "local_pb2", "local_pb2_grpc", "types_pb2"]
