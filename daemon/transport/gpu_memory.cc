#include "daemon/transport/gpu_memory.h"

#include "absl/strings/str_cat.h"
#include "common/gpu/device_health.h"
#include "daemon/gpu/staging.h"

namespace wb::transport {

bool SoftwareGpuMemorySupported() { return gpu::StagingAvailable().ok(); }

absl::Status CheckGpuMemory(const std::string& transport, const MemoryRef& mem) {
  const std::string context =
      absl::StrCat(transport, " transport: GPU memory (cuda:", mem.device, "): ");
  if (std::string why = gpu::DeviceUnusableReason(mem.device); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(context, why));
  }
  if (absl::Status s = gpu::StagingAvailable(); !s.ok()) {
    // Without the toolkit this build cannot do it at all; without a device this host cannot.
    const bool built_without = s.message() == "built without CUDA";
    return absl::Status(
        built_without ? absl::StatusCode::kUnimplemented : absl::StatusCode::kFailedPrecondition,
        absl::StrCat(context, s.message()));
  }
  if (absl::Status s = gpu::CheckDeviceRange(mem.addr, mem.length, mem.device); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(context, s.message()));
  }
  return absl::OkStatus();
}

}  // namespace wb::transport
