// CUDA IPC with the CUDA runtime. The allocation base of an interior pointer comes from the
// driver's cuMemGetAddressRange, reached through cudaGetDriverEntryPointByVersion so that no
// link against libcuda is needed.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_ipc.h"

namespace wb::gpu {
namespace {

absl::Status CudaError(cudaError_t err, const std::string& what) {
  cudaGetLastError();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

using GetAddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);

absl::StatusOr<GetAddressRangeFn> AddressRangeFn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 3020,
                                                     cudaEnableDefault, &found);
  if (err != cudaSuccess) return CudaError(err, "looking up cuMemGetAddressRange");
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return absl::InternalError("the CUDA driver has no cuMemGetAddressRange");
  }
  return reinterpret_cast<GetAddressRangeFn>(fn);
}

// Runs fn with `device` current, restoring the caller's device afterwards.
template <typename Fn>
absl::Status OnDevice(int device, Fn fn) {
  int previous = 0;
  if (cudaError_t err = cudaGetDevice(&previous); err != cudaSuccess) {
    return CudaError(err, "cudaGetDevice");
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  absl::Status status = fn();
  cudaSetDevice(previous);
  return status;
}

}  // namespace

absl::StatusOr<weightbeam::v1::CudaIpc> GetIpcHandle(const void* ptr, size_t length) {
  cudaPointerAttributes attr;
  if (cudaError_t err = cudaPointerGetAttributes(&attr, ptr); err != cudaSuccess) {
    return CudaError(err, "cudaPointerGetAttributes");
  }
  if (attr.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("pointer ", reinterpret_cast<uintptr_t>(ptr),
                     " is not cudaMalloc'ed device memory; CUDA IPC cannot export it"));
  }
  absl::StatusOr<GetAddressRangeFn> range_fn = AddressRangeFn();
  if (!range_fn.ok()) return range_fn.status();
  weightbeam::v1::CudaIpc ipc;
  absl::Status s = OnDevice(attr.device, [&]() -> absl::Status {
    CUdeviceptr base = 0;
    size_t size = 0;
    if (CUresult r = (*range_fn)(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
        r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuMemGetAddressRange failed with CUresult ", r));
    }
    const uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - base;
    if (offset + length > size) {
      return absl::InvalidArgumentError(absl::StrCat("range of ", length, " bytes at offset ",
                                                     offset, " runs past its allocation of ", size,
                                                     " bytes on cuda:", attr.device));
    }
    cudaIpcMemHandle_t handle;
    if (cudaError_t err = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base));
        err != cudaSuccess) {
      return CudaError(err, "cudaIpcGetMemHandle");
    }
    ipc.set_ipc_handle(std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
    ipc.set_offset(offset);
    ipc.set_length(length);
    ipc.set_device(attr.device);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return ipc;
}

IpcOps CudaIpcOps() {
  IpcOps ops;
  ops.open = [](const std::string& handle_bytes, int device) -> absl::StatusOr<void*> {
    static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "IPC handle size");
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, handle_bytes.data(), sizeof(handle));
    void* base = nullptr;
    absl::Status s = OnDevice(device, [&]() -> absl::Status {
      if (cudaError_t err = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
          err != cudaSuccess) {
        return CudaError(err, "cudaIpcOpenMemHandle");
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return base;
  };
  ops.size = [](void* base, int device) -> absl::StatusOr<uint64_t> {
    auto range = AddressRangeFn();
    if (!range.ok()) return range.status();
    size_t size = 0;
    absl::Status s = OnDevice(device, [&]() -> absl::Status {
      CUdeviceptr b = 0;
      if (CUresult r = (*range)(&b, &size, reinterpret_cast<CUdeviceptr>(base)); r != 0) {
        return absl::InternalError(absl::StrCat("cuMemGetAddressRange failed with CUresult ", r));
      }
      // The mapping may start inside a larger block: count from `base` to its end.
      size -= reinterpret_cast<CUdeviceptr>(base) - b;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return static_cast<uint64_t>(size);
  };
  ops.close = [](void* base, int device) -> absl::Status {
    return OnDevice(device, [&]() -> absl::Status {
      if (cudaError_t err = cudaIpcCloseMemHandle(base); err != cudaSuccess) {
        return CudaError(err, "cudaIpcCloseMemHandle");
      }
      return absl::OkStatus();
    });
  };
  return ops;
}

}  // namespace wb::gpu
