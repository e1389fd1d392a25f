// CUDA IPC in builds without the CUDA toolkit: every call says so.
#include "common/gpu/cuda_ipc.h"

namespace wb::gpu {

absl::StatusOr<weightbeam::v1::CudaIpc> GetIpcHandle(const void*, size_t) {
  return absl::FailedPreconditionError("CUDA IPC: built without CUDA");
}

absl::Status SynchronizeDevice(int) {
  return absl::FailedPreconditionError("CUDA: built without CUDA");
}

IpcOps CudaIpcOps() {
  IpcOps ops;
  ops.open = [](const std::string&, int) -> absl::StatusOr<void*> {
    return absl::FailedPreconditionError("built without CUDA");
  };
  ops.close = [](void*, int) { return absl::OkStatus(); };
  ops.devices = []() -> absl::StatusOr<std::vector<DeviceIdentity>> {
    return absl::FailedPreconditionError("built without CUDA");
  };
  ops.size = [](void*, int) -> absl::StatusOr<uint64_t> {
    return absl::FailedPreconditionError("built without CUDA");
  };
  return ops;
}

}  // namespace wb::gpu
