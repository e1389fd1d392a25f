// Device memory with the CUDA runtime.
#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/device_memory.h"

namespace wb::gpu {
namespace {

absl::Status CudaError(cudaError_t err, const std::string& what) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

// The status of a copy of `bytes` bytes (`what`: its direction) that returned `err`.
absl::Status CopyStatus(cudaError_t err, const char* what, size_t bytes) {
  if (err == cudaSuccess) return absl::OkStatus();
  return CudaError(err, absl::StrCat(what, " copy of ", bytes, " bytes"));
}

}  // namespace

absl::Status CudaAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device (cudaGetDeviceCount: ", cudaGetErrorString(err), ")"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device");
  return absl::OkStatus();
}

absl::StatusOr<double> PeakMemoryBandwidthGbps(int device) {
  if (absl::Status s = CudaAvailable(); !s.ok()) return s;
  int clock_khz = 0, bus_bits = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
      err != cudaSuccess) {
    return CudaError(err, "cudaDevAttrMemoryClockRate");
  }
  if (cudaError_t err = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
      err != cudaSuccess) {
    return CudaError(err, "cudaDevAttrGlobalMemoryBusWidth");
  }
  if (clock_khz <= 0 || bus_bits <= 0) {
    return absl::UnavailableError(absl::StrCat("cuda:", device, " reports no memory clock"));
  }
  return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, int device) {
  if (absl::Status s = CudaAvailable(); !s.ok()) return s;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  void* data = nullptr;
  if (cudaError_t err = cudaMalloc(&data, bytes); err != cudaSuccess) {
    return CudaError(err, absl::StrCat("cudaMalloc of ", bytes, " bytes on cuda:", device));
  }
  return DeviceBuffer(data, bytes, device);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

void DeviceBuffer::Reset() {
  // The owning device first: a thread that never set it would free through (and create) a
  // context on GPU 0.
  if (data_ != nullptr && cudaSetDevice(device_) == cudaSuccess) cudaFree(data_);
  data_ = nullptr;
  size_ = 0;
}

absl::Status CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes, int device) {
  if (device >= 0) {
    if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
      return CudaError(err, absl::StrCat("cudaSetDevice(", device, ")"));
    }
  }
  return CopyStatus(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice),
                    "host -> device", bytes);
}

absl::Status CopyDeviceToHost(void* host_dst, const void* device_src, size_t bytes, int device) {
  if (device >= 0) {
    if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
      return CudaError(err, absl::StrCat("cudaSetDevice(", device, ")"));
    }
  }
  return CopyStatus(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost),
                    "device -> host", bytes);
}

absl::Status CopyHostToDeviceAsync(void* device_dst, const void* host_src, size_t bytes,
                                   void* stream) {
  return CopyStatus(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice,
                                    static_cast<cudaStream_t>(stream)),
                    "async host -> device", bytes);
}

absl::Status CopyDeviceToHostAsync(void* host_dst, const void* device_src, size_t bytes,
                                   void* stream) {
  return CopyStatus(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost,
                                    static_cast<cudaStream_t>(stream)),
                    "async device -> host", bytes);
}

absl::Status SynchronizeStream(void* stream) {
  if (cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
      err != cudaSuccess) {
    return CudaError(err, "cudaStreamSynchronize");
  }
  return absl::OkStatus();
}

}  // namespace wb::gpu
