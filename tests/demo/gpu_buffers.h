// wb-demo --gpu: the synthetic processes keep their tensors in device memory. The host buffer
// Allocate() made stays the place where values are computed and checked; a device buffer of the
// same layout is what the agent sees (registered through CUDA IPC). Trainers upload after each
// change, inference workers download before each check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/gpu/device_memory.h"
#include "tests/demo/role_support.h"

namespace wb::demo {

// The exit code of `wb-demo --gpu` on a machine without a usable CUDA device (./wb gpu-check
// reports it as "no GPU", not as a failure).
constexpr int kNoGpuExitCode = 3;

// Ok when the demo can put its buffers on CUDA device 0; else why not.
absl::Status GpuDemoAvailable();

class DeviceCopy {
 public:
  // A device buffer as large as `host`'s, on CUDA device 0.
  static absl::StatusOr<DeviceCopy> Create(const Registered& host);

  // The device buffer: entry i lives at data() + host.offsets[i] (registered through CUDA IPC).
  uint8_t* data() const { return static_cast<uint8_t*>(device_.data()); }
  absl::Status Upload() const;    // host buffer -> device buffer
  absl::Status Download() const;  // device buffer -> host buffer

 private:
  DeviceCopy(const Registered& host, gpu::DeviceBuffer device)
      : host_(&host), device_(std::move(device)) {}
  const Registered* host_;
  gpu::DeviceBuffer device_;
};

}  // namespace wb::demo
