// Registers a MemoryRef with one protection domain: host memory through ibv_reg_mr, CUDA memory
// through ibv_reg_dmabuf_mr with a dma-buf fd from the driver (cuMemGetHandleForAddressRange,
// loaded with dlopen so libcuda is not needed at link time), falling back to ibv_reg_mr, which
// works when the nvidia-peermem module is loaded.
#pragma once

#include "absl/status/statusor.h"
#include "daemon/transport/rdma/verbs.h"
#include "daemon/transport/transport.h"

namespace wb::transport::rdma {

// True when this build can register CUDA memory (compiled with CUDA).
bool CudaRegistrationCompiled();
// Whether GPU memory can be registered on this host at all: a CUDA build, and nvidia-peermem
// loaded or a device that supports dma-buf (checked without creating a context). Registration
// of each region may still be declined (an IPC-imported range the driver will not export).
bool CudaRegistrationPossible();

absl::StatusOr<MrPtr> RegisterMemory(ibv_pd* pd, const MemoryRef& mem, int access);

}  // namespace wb::transport::rdma
