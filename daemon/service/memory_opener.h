// Opens the memory a local process registered: POSIX shared memory (mapped), or a CUDA IPC
// handle (opened on the device, cached per allocation base) when the agent has CUDA.
#pragma once

#include "daemon/registry/region_registry.h"

namespace wb::service {

absl::StatusOr<registry::OpenedMemory> OpenMemory(const weightbeam::v1::MemoryHandle& handle);

// Whether this agent can register GPU memory, and if not, why ("built without CUDA", ...).
bool GpuMemorySupported(std::string* why_not);

}  // namespace wb::service
