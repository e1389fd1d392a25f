#include "daemon/transport/rdma/memory_registration.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace wb::transport::rdma {
namespace {

#ifdef WB_HAVE_CUDA
// CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size,
//                                        CUmemRangeHandleType type, unsigned long long flags)
using GetHandleFn = int (*)(void*, unsigned long long, size_t, int, unsigned long long);
constexpr int kDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

GetHandleFn LoadGetHandle() {
  static GetHandleFn fn = []() -> GetHandleFn {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    return reinterpret_cast<GetHandleFn>(dlsym(lib, "cuMemGetHandleForAddressRange"));
  }();
  return fn;
}

// dma-buf export wants host-page-aligned ranges: register the aligned span, address the MR by
// the caller's virtual addresses (iova = aligned base).
absl::StatusOr<MrPtr> RegisterCudaDmaBuf(ibv_pd* pd, const MemoryRef& mem, int access) {
  GetHandleFn get_handle = LoadGetHandle();
  if (get_handle == nullptr) {
    return absl::UnavailableError("libcuda.so.1 or cuMemGetHandleForAddressRange not available");
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

absl::StatusOr<MrPtr> RegisterMemory(ibv_pd* pd, const MemoryRef& mem, int access) {
  if (mem.kind == MemoryKind::kHost) return RegisterHostMr(pd, mem.addr, mem.length, access);
#ifdef WB_HAVE_CUDA
  absl::StatusOr<MrPtr> dmabuf = RegisterCudaDmaBuf(pd, mem, access);
  if (dmabuf.ok()) return dmabuf;
  // nvidia-peermem lets ibv_reg_mr pin GPU memory directly.
  absl::StatusOr<MrPtr> peermem = RegisterHostMr(pd, mem.addr, mem.length, access);
  if (peermem.ok()) return peermem;
  return absl::UnavailableError(absl::StrCat("cannot register CUDA memory of device ", mem.device,
                                             " (", mem.length,
                                             " bytes): dma-buf: ", dmabuf.status().message(),
                                             "; nvidia-peermem: ", peermem.status().message()));
#else
  return absl::UnimplementedError(absl::StrCat("cannot register CUDA memory of device ", mem.device,
                                               ": this build has no CUDA support"));
#endif
}

}  // namespace wb::transport::rdma
