// GPU staging in builds without the CUDA toolkit: every call says so.
#include "daemon/gpu/staging.h"

namespace wb::gpu {
namespace {

absl::Status NoCuda() { return absl::FailedPreconditionError("built without CUDA"); }

}  // namespace

absl::Status StagingAvailable() { return NoCuda(); }
absl::Status CheckDeviceRange(const void*, uint64_t, int) { return NoCuda(); }
absl::Status CopyAnyToAny(void*, const void*, uint64_t, int) { return NoCuda(); }

absl::StatusOr<std::unique_ptr<DeviceStaging>> DeviceStaging::Create(
    const StagingOptions& options) {
  if (auto s = ValidateStagingOptions(options); !s.ok()) return s;
  return NoCuda();
}

}  // namespace wb::gpu
