#include "daemon/transport/rdma/memory_registration.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/transport/gpu_memory.h"

#ifdef WB_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

namespace wb::transport::rdma {
namespace {

#ifdef WB_HAVE_CUDA
// CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size,
//                                        CUmemRangeHandleType type, unsigned long long flags)
using GetHandleFn = int (*)(void*, unsigned long long, size_t, int, unsigned long long);
using InitFn = int (*)(unsigned int);
using DeviceGetCountFn = int (*)(int*);
using DeviceGetFn = int (*)(int*, int);
using DeviceAttributeFn = int (*)(int*, int, int);
constexpr int kDmaBufFd = 1;           // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
constexpr int kDmaBufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
static_assert(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD == kDmaBufFd, "cuda.h changed");
static_assert(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED == kDmaBufSupported, "cuda.h changed");

// The driver functions, from libcuda.so.1 (no link against it).
struct Driver {
  GetHandleFn get_handle = nullptr;
  InitFn init = nullptr;
  DeviceGetCountFn device_count = nullptr;
  DeviceGetFn device_get = nullptr;
  DeviceAttributeFn attribute = nullptr;
};
const Driver& LoadDriver() {
  static const Driver driver = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return d;
    d.get_handle = reinterpret_cast<GetHandleFn>(dlsym(lib, "cuMemGetHandleForAddressRange"));
    d.init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
    d.device_count = reinterpret_cast<DeviceGetCountFn>(dlsym(lib, "cuDeviceGetCount"));
    d.device_get = reinterpret_cast<DeviceGetFn>(dlsym(lib, "cuDeviceGet"));
    d.attribute = reinterpret_cast<DeviceAttributeFn>(dlsym(lib, "cuDeviceGetAttribute"));
    return d;
  }();
  return driver;
}

// Whether `ordinal` can export dma-bufs; needs no context (cuInit only).
bool DmaBufSupported(const Driver& d, int ordinal) {
  if (d.init == nullptr || d.device_get == nullptr || d.attribute == nullptr) return false;
  if (d.init(0) != 0) return false;
  int dev = 0, supported = 0;
  return d.device_get(&dev, ordinal) == 0 && d.attribute(&supported, kDmaBufSupported, dev) == 0 &&
         supported != 0;
}

bool PeermemLoaded() {
  return access("/sys/module/nvidia_peermem", F_OK) == 0 ||
         access("/sys/module/nv_peer_mem", F_OK) == 0;
}

// dma-buf export wants host-page-aligned ranges: register the aligned span, address the MR by
// the caller's virtual addresses (iova = aligned base). The range's device is made current
// first (the export runs in its context, not whichever device this thread last used).
absl::StatusOr<MrPtr> RegisterCudaDmaBuf(ibv_pd* pd, const MemoryRef& mem, int access) {
  const Driver& driver = LoadDriver();
  GetHandleFn get_handle = driver.get_handle;
  if (get_handle == nullptr) {
    return absl::UnavailableError("libcuda.so.1 or cuMemGetHandleForAddressRange not available");
  }
  if (!DmaBufSupported(driver, mem.device)) {
    return absl::UnavailableError(absl::StrCat(
        "cuda:", mem.device, " does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)"));
  }
  if (cudaError_t e = cudaSetDevice(mem.device); e != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("cudaSetDevice(", mem.device, "): ", cudaGetErrorString(e)));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t addr = reinterpret_cast<uint64_t>(mem.addr);
  const uint64_t base = addr / page * page;
  const uint64_t span = (addr + mem.length + page - 1) / page * page - base;
  int fd = -1;
  int rc = get_handle(&fd, base, span, kDmaBufFd, 0);
  if (rc != 0 || fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cuMemGetHandleForAddressRange(dma-buf) failed with CUresult ", rc));
  }
  MrPtr mr(ibv_reg_dmabuf_mr(pd, 0, span, base, fd, access));
  int err = errno;
  close(fd);
  if (!mr) {
    return absl::UnavailableError(absl::StrCat("ibv_reg_dmabuf_mr: ", std::strerror(err)));
  }
  return mr;
}
#endif

}  // namespace

bool CudaRegistrationCompiled() {
#ifdef WB_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool CudaRegistrationPossible() {
#ifdef WB_HAVE_CUDA
  static const bool possible = [] {
    if (PeermemLoaded()) return true;
    const Driver& d = LoadDriver();
    int count = 0;
    if (d.get_handle == nullptr || d.init == nullptr || d.device_count == nullptr ||
        d.init(0) != 0 || d.device_count(&count) != 0) {
      return false;
    }
    for (int i = 0; i < count; ++i) {
      if (DmaBufSupported(d, i)) return true;
    }
    return false;
  }();
  return possible;
#else
  return false;
#endif
}

absl::StatusOr<MrPtr> RegisterMemory(ibv_pd* pd, const MemoryRef& mem, int access) {
  if (mem.kind == MemoryKind::kHost) return RegisterHostMr(pd, mem.addr, mem.length, access);
  // The range must be device memory of a usable device first: a soft NIC (rxe) pins any host
  // range, so without this host memory called "cuda" would register through the peermem path.
  if (absl::Status s = CheckGpuMemory("rdma", mem); !s.ok()) return s;
#ifdef WB_HAVE_CUDA
  absl::StatusOr<MrPtr> dmabuf = RegisterCudaDmaBuf(pd, mem, access);
  if (dmabuf.ok()) return dmabuf;
  // nvidia-peermem lets ibv_reg_mr pin GPU memory directly; without it ibv_reg_mr cannot.
  absl::Status peermem_status = absl::UnavailableError("module not loaded");
  if (PeermemLoaded()) {
    absl::StatusOr<MrPtr> peermem = RegisterHostMr(pd, mem.addr, mem.length, access);
    if (peermem.ok()) return peermem;
    peermem_status = peermem.status();
  }
  // Declined, not failed: the tensor stays registered with tcp and local, and the planner
  // routes around rdma (a route that needs it names this reason).
  return transport::DeclineRegion(
      absl::StrCat("rdma: cannot register CUDA memory of cuda:", mem.device, " (", mem.length,
                   " bytes): dma-buf: ", dmabuf.status().message(),
                   "; nvidia-peermem: ", peermem_status.message()));
#else
  return absl::UnimplementedError("rdma transport: GPU memory: built without CUDA");
#endif
}

}  // namespace wb::transport::rdma
