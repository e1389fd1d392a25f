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

absl::StatusOr<MrPtr> RegisterMemory(ibv_pd* pd, const MemoryRef& mem, int access);

}  // namespace wb::transport::rdma
