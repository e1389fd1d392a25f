// Device memory for the agent's staging buffers, tests and benchmarks: an owning DeviceBuffer
// and host <-> device copies. Without CUDA every call returns FailedPrecondition
// "built without CUDA" or "no CUDA device (...)".
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wb::gpu {

// Ok when at least one CUDA device can be used; else why not.
absl::Status CudaAvailable();

// Theoretical peak memory bandwidth of `device` in GB/s (memory clock x bus width x 2 for DDR),
// for reporting what fraction of it a kernel reaches.
absl::StatusOr<double> PeakMemoryBandwidthGbps(int device = 0);

// cudaMalloc'ed memory on one device, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, int device = 0);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }

 private:
  DeviceBuffer(void* data, size_t size, int device) : data_(data), size_(size), device_(device) {}
  void Reset();

  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = 0;
};

// Synchronous copies (they wait for the copy, and for earlier work on the default stream).
// `device` >= 0: set current first (agent threads must never fall back to GPU 0's context).
absl::Status CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes,
                              int device = -1);
absl::Status CopyDeviceToHost(void* host_dst, const void* device_src, size_t bytes,
                              int device = -1);

// Asynchronous copies on `stream` (a cudaStream_t; nullptr = default stream).
absl::Status CopyHostToDeviceAsync(void* device_dst, const void* host_src, size_t bytes,
                                   void* stream);
absl::Status CopyDeviceToHostAsync(void* host_dst, const void* device_src, size_t bytes,
                                   void* stream);

// Waits for everything enqueued on `stream` and reports the first error of its work.
absl::Status SynchronizeStream(void* stream);

}  // namespace wb::gpu
