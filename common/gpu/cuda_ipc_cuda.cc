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

// A driver function through the runtime (no link against libcuda).
template <typename F>
absl::StatusOr<F> DriverFn(const char* name, int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found);
  if (err != cudaSuccess) return CudaError(err, absl::StrCat("looking up ", name));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return absl::InternalError(absl::StrCat("the CUDA driver has no ", name));
  }
  return reinterpret_cast<F>(fn);
}

using GetAddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);
using PointerAttributeFn = CUresult (*)(void* data, CUpointer_attribute attribute, CUdeviceptr ptr);
using CtxGetCurrentFn = CUresult (*)(CUcontext* ctx);
using CtxSetCurrentFn = CUresult (*)(CUcontext ctx);

absl::StatusOr<GetAddressRangeFn> AddressRangeFn() {
  return DriverFn<GetAddressRangeFn>("cuMemGetAddressRange", 3020);
}

// Runs fn with `device` current, then puts back the context the calling thread had (none
// included: restoring "device 0" by cudaSetDevice would create a context on GPU 0 in a thread
// that never had one).
template <typename Fn>
absl::Status OnDevice(int device, Fn fn) {
  static const auto get = DriverFn<CtxGetCurrentFn>("cuCtxGetCurrent", 4000);
  static const auto set = DriverFn<CtxSetCurrentFn>("cuCtxSetCurrent", 4000);
  if (!get.ok()) return get.status();
  if (!set.ok()) return set.status();
  CUcontext previous = nullptr;
  if (CUresult r = (*get)(&previous); r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuCtxGetCurrent failed with CUresult ", r));
  }
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  absl::Status status = fn();
  (*set)(previous);
  return status;
}

// The identity of `device` (UUID and PCI bus id), which every process agrees on.
absl::Status FillIdentity(int device, DeviceIdentity* id) {
  cudaDeviceProp prop;
  if (cudaError_t err = cudaGetDeviceProperties(&prop, device); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cudaGetDeviceProperties(", device, ")"));
  }
  id->ordinal = device;
  id->uuid.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  char bus_id[32] = {};
  if (cudaError_t err = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cudaDeviceGetPCIBusId(", device, ")"));
  }
  id->pci_bus_id = bus_id;
  return absl::OkStatus();
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
  static const auto attribute_fn = DriverFn<PointerAttributeFn>("cuPointerGetAttribute", 4000);
  if (!attribute_fn.ok()) return attribute_fn.status();
  DeviceIdentity identity;
  if (auto s = FillIdentity(attr.device, &identity); !s.ok()) return s;
  weightbeam::v1::CudaIpc ipc;
  absl::Status s = OnDevice(attr.device, [&]() -> absl::Status {
    // VMM mappings and pool allocations have no legacy IPC handle: refuse them with what to
    // change, not with cudaIpcGetMemHandle's "invalid argument".
    const auto dptr = reinterpret_cast<CUdeviceptr>(ptr);
    int legacy_ipc = 1;
    if (CUresult r =
            (*attribute_fn)(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, dptr);
        r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat(
          "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE) failed with CUresult ", r));
    }
    if (!legacy_ipc) {
      CUmemoryPool pool = nullptr;
      const bool from_pool =
          (*attribute_fn)(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, dptr) == CUDA_SUCCESS &&
          pool != nullptr;
      return absl::FailedPreconditionError(
          NotIpcCapableMessage(reinterpret_cast<uintptr_t>(ptr), attr.device, from_pool));
    }
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
    ipc.set_device_uuid(identity.uuid);
    ipc.set_pci_bus_id(identity.pci_bus_id);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return ipc;
}

absl::Status SynchronizeDevice(int device) {
  return OnDevice(device, [&]() -> absl::Status {
    if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
      return CudaError(err, absl::StrCat("cudaDeviceSynchronize on cuda:", device));
    }
    return absl::OkStatus();
  });
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
  ops.devices = []() -> absl::StatusOr<std::vector<DeviceIdentity>> {
    int count = 0;
    if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
      return CudaError(err, "cudaGetDeviceCount");
    }
    std::vector<DeviceIdentity> table(count);
    for (int i = 0; i < count; ++i) {
      if (auto s = FillIdentity(i, &table[i]); !s.ok()) return s;
    }
    return table;
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
