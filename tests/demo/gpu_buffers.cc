#include "tests/demo/gpu_buffers.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace wb::demo {

namespace {
constexpr int kDevice = 0;
}

absl::Status GpuDemoAvailable() { return gpu::CudaAvailable(); }

absl::StatusOr<DeviceCopy> DeviceCopy::Create(const Registered& host) {
  auto device = gpu::DeviceBuffer::Allocate(host.buffer.size(), kDevice);
  if (!device.ok()) return device.status();
  return DeviceCopy(host, std::move(*device));
}

absl::Status DeviceCopy::Upload() const {
  return gpu::CopyHostToDevice(device_.data(), host_->buffer.data(), host_->buffer.size());
}

absl::Status DeviceCopy::Download() const {
  return gpu::CopyDeviceToHost(host_->buffer.data(), device_.data(), host_->buffer.size());
}

}  // namespace wb::demo
