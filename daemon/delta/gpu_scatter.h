// Delta mode on GPU destinations: the device half of a scatter (records resolved on the host
// into byte offsets and values are copied to a reused device staging buffer and written by one
// kernel), plus device -> host copies for verification. Plain C++ (no absl) so that nvcc never
// sees absl; gpu_apply.h wraps it into absl::Status. Without the CUDA toolkit
// gpu_scatter_nocuda.cc stands in and reports kBuiltWithoutCuda.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

namespace wb::delta::cuda {

enum class ScatterCode { kOk, kBuiltWithoutCuda, kCudaError };

// Owns, per device, one cudaMalloc'd staging buffer (grown as needed, reused across commits)
// and one stream of its own. Thread-safe: calls are serialised.
class DeviceScatter {
 public:
  DeviceScatter() = default;
  ~DeviceScatter();
  DeviceScatter(const DeviceScatter&) = delete;
  DeviceScatter& operator=(const DeviceScatter&) = delete;

  // Writes `count` elements of `elem_size` (1, 2 or 4) bytes: values[i * elem_size ...] at
  // base + offsets[i], on `device`, and waits for it. `base` is device memory; offsets and
  // values are host memory. On failure `error` holds the CUDA call and its error string.
  ScatterCode Scatter(int device, void* base, const uint64_t* offsets, const uint8_t* values,
                      uint64_t count, int elem_size, std::string* error);

  // Synchronous copy of `bytes` from device memory on `device` into host memory.
  ScatterCode CopyToHost(int device, void* host_dst, const void* device_src, uint64_t bytes,
                         std::string* error);

 private:
  struct State;  // defined by the implementation (staging buffers and streams per device)
  std::mutex mu_;
  State* state_ = nullptr;
};

}  // namespace wb::delta::cuda
