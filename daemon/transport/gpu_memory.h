// GPU memory in the software transports (tcp, local): whether they can take it here, and the
// checks a kCuda region passes before it is registered. Both staged through daemon/gpu/staging.h.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "daemon/transport/transport.h"

namespace wb::transport {

// True when this build has CUDA and this host a device (what Capabilities::gpu_memory says).
bool SoftwareGpuMemorySupported();

// Ok for a kCuda region the transport can stage. Otherwise, prefixed "<transport> transport: GPU
// memory (cuda:N): ": Unimplemented "built without CUDA", FailedPrecondition "no CUDA device
// (...)", or InvalidArgument when the range is not device memory of that device.
absl::Status CheckGpuMemory(const std::string& transport, const MemoryRef& mem);

}  // namespace wb::transport
