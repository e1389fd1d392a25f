// Device memory in builds without the CUDA toolkit: every call says so.
#include "daemon/gpu/device_memory.h"

namespace wb::gpu {
namespace {

absl::Status NoCuda() { return absl::FailedPreconditionError("built without CUDA"); }

}  // namespace

absl::Status CudaAvailable() { return NoCuda(); }

absl::StatusOr<double> PeakMemoryBandwidthGbps(int) { return NoCuda(); }

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t, int) { return NoCuda(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept { return *this; }
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::Reset() {}

absl::Status CopyHostToDevice(void*, const void*, size_t, int) { return NoCuda(); }
absl::Status CopyDeviceToHost(void*, const void*, size_t, int) { return NoCuda(); }
absl::Status CopyHostToDeviceAsync(void*, const void*, size_t, void*) { return NoCuda(); }
absl::Status CopyDeviceToHostAsync(void*, const void*, size_t, void*) { return NoCuda(); }
absl::Status SynchronizeStream(void*) { return NoCuda(); }

}  // namespace wb::gpu
