// Whether the driver exports device memory as a dma-buf (what rdma's ibv_reg_dmabuf_mr needs,
// daemon/transport/rdma/memory_registration.cc): cuMemGetHandleForAddressRange on a fresh
// 2 MiB cudaMalloc, libcuda loaded with dlopen. Prints one line; exit 0 allowed, 2 refused by
// the driver, 1 no device.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>

#include "daemon/gpu/device_memory.h"

int main() {
  if (absl::Status s = wb::gpu::CudaAvailable(); !s.ok()) {
    std::printf("dma-buf: not probed (%s)\n", std::string(s.message()).c_str());
    return 1;
  }
  auto buf = wb::gpu::DeviceBuffer::Allocate(2 << 20);
  if (!buf.ok()) {
    std::printf("dma-buf: not probed (%s)\n", std::string(buf.status().message()).c_str());
    return 1;
  }
  using GetHandleFn = int (*)(void*, unsigned long long, size_t, int, unsigned long long);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  auto fn =
      lib ? reinterpret_cast<GetHandleFn>(dlsym(lib, "cuMemGetHandleForAddressRange")) : nullptr;
  if (fn == nullptr) {
    std::printf("dma-buf: refused (driver has no cuMemGetHandleForAddressRange)\n");
    return 2;
  }
  int fd = -1;
  const int rc = fn(&fd, reinterpret_cast<unsigned long long>(buf->data()), 2 << 20,
                    /*CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD=*/1, 0);
  if (rc != 0 || fd < 0) {
    std::printf("dma-buf: refused by the driver (CUresult %d; open kernel modules needed)\n", rc);
    return 2;
  }
  close(fd);
  std::printf("dma-buf: allowed (exported fd for 2 MiB of device memory)\n");
  return 0;
}
