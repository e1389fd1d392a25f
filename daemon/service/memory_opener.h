// Opens the memory a local process registered: POSIX shared memory (mapped), or a CUDA IPC
// handle (opened on the device, cached per allocation base) when the agent has CUDA.
#pragma once

#include "daemon/registry/region_registry.h"

namespace wb::service {

// Shared memory is mapped only when `caller` (kernel credentials) may itself read and write
// the object; see ShmMapping for the rule.
absl::StatusOr<registry::OpenedMemory> OpenMemory(const weightbeam::v1::MemoryHandle& handle,
                                                  const registry::Caller& caller);

// Whether this agent can register GPU memory, and if not, why ("built without CUDA", ...).
bool GpuMemorySupported(std::string* why_not);

}  // namespace wb::service
