// Delta mode on the receiving agent for destinations in GPU memory: a resolved delta
// (ScatterList) scattered into device memory by the CUDA scatter, and the destination hash of
// device memory (landed ranges copied back to the host). Errors name the tensor, the device
// and the CUDA error; without CUDA every call says why it cannot run.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/delta/gpu_scatter.h"
#include "daemon/delta/op_layout.h"

namespace wb::delta {

// Ok when deltas can be applied to GPU memory here; else FailedPrecondition with the reason
// ("built without CUDA" or "no CUDA device (...)").
absl::Status GpuScatterAvailable();

// Where one destination region lives: host memory, or device memory on `device`.
struct DestinationMemory {
  uint8_t* addr = nullptr;
  bool on_device = false;
  int device = -1;
};

class GpuApplier {
 public:
  // Writes `list` into the data and scale regions (each on the host or a device). `tensor`
  // names the destination in errors.
  absl::Status Scatter(const ScatterList& list, const DestinationMemory& dst,
                       const DestinationMemory& scales, absl::string_view tensor);

  // HashDestination of regions that may live on a device: each landed segment is copied back
  // into a host buffer first.
  absl::StatusOr<uint64_t> Hash(const OpLayout& layout, const DestinationMemory& dst,
                                const DestinationMemory& scales, absl::string_view tensor);

 private:
  cuda::DeviceScatter scatter_;
};

}  // namespace wb::delta
