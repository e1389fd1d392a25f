// CUDA implementation of DeviceScatter: staging copy on a stream of its own, one kernel.
#include <cuda_runtime.h>

#include <map>

#include "common/gpu/device_health.h"
#include "daemon/delta/gpu_encode_geometry.h"
#include "daemon/delta/gpu_scatter.h"

namespace wb::delta::cuda {

namespace {

// Element i: `elem_size` bytes from values at base + offsets[i]. Byte stores, because
// destination offsets need not be aligned to the element size (strided, offset tensors).
__global__ void ScatterKernel(uint8_t* base, const uint64_t* offsets, const uint8_t* values,
                              uint64_t count, int elem_size) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    uint8_t* p = base + offsets[i];
    const uint8_t* v = values + i * elem_size;
    for (int k = 0; k < elem_size; ++k) p[k] = v[k];
  }
}

bool Failed(cudaError_t e, const char* what, int device, std::string* error) {
  if (e == cudaSuccess) return false;
  cudaGetLastError();  // clear it, so the next launch is not blamed for it
  *error = std::string(what) + " on CUDA device " + std::to_string(device) + ": " +
           cudaGetErrorString(e);
  gpu::NoteCudaError(device, e, *error);
  return true;
}

}  // namespace

struct DeviceScatter::State {
  struct PerDevice {
    void* staging = nullptr;
    uint64_t capacity = 0;
    cudaStream_t stream = nullptr;
  };
  std::map<int, PerDevice> devices;
};

DeviceScatter::~DeviceScatter() {
  if (!state_) return;
  for (auto& [device, d] : state_->devices) {
    if (cudaSetDevice(device) != cudaSuccess) continue;
    if (d.staging) cudaFree(d.staging);
    if (d.stream) cudaStreamDestroy(d.stream);
  }
  delete state_;
}

ScatterCode DeviceScatter::Scatter(int device, void* base, const uint64_t* offsets,
                                   const uint8_t* values, uint64_t count, int elem_size,
                                   std::string* error) {
  if (count == 0) return ScatterCode::kOk;
  std::lock_guard<std::mutex> lock(mu_);
  if (!state_) state_ = new State;
  if (std::string why = gpu::DeviceUnusableReason(device); !why.empty()) {
    *error = why;
    return ScatterCode::kCudaError;
  }
  if (Failed(cudaSetDevice(device), "cudaSetDevice", device, error)) {
    return ScatterCode::kCudaError;
  }
  State::PerDevice& d = state_->devices[device];
  if (!d.stream && Failed(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking),
                          "cudaStreamCreate", device, error)) {
    return ScatterCode::kCudaError;
  }
  // Staging: offsets (8-byte aligned at the start), then the values.
  const uint64_t offset_bytes = count * sizeof(uint64_t);
  const uint64_t need = offset_bytes + count * static_cast<uint64_t>(elem_size);
  if (need > d.capacity) {
    if (d.staging) cudaFree(d.staging);
    d.staging = nullptr;
    d.capacity = 0;
    const uint64_t grown = need + need / 4;
    if (Failed(cudaMalloc(&d.staging, grown), "cudaMalloc of the delta staging buffer", device,
               error)) {
      d.staging = nullptr;
      return ScatterCode::kCudaError;
    }
    d.capacity = grown;
  }
  uint8_t* staging = static_cast<uint8_t*>(d.staging);
  if (Failed(cudaMemcpyAsync(staging, offsets, offset_bytes, cudaMemcpyHostToDevice, d.stream),
             "cudaMemcpyAsync of the delta offsets", device, error) ||
      Failed(cudaMemcpyAsync(staging + offset_bytes, values, need - offset_bytes,
                             cudaMemcpyHostToDevice, d.stream),
             "cudaMemcpyAsync of the delta values", device, error)) {
    return ScatterCode::kCudaError;
  }
  const int threads = gpu_geometry::kScatterThreads;
  const int blocks = gpu_geometry::ScatterBlocks(count);
  ScatterKernel<<<blocks, threads, 0, d.stream>>>(static_cast<uint8_t*>(base),
                                                  reinterpret_cast<const uint64_t*>(staging),
                                                  staging + offset_bytes, count, elem_size);
  if (Failed(cudaGetLastError(), "launching the delta scatter kernel", device, error) ||
      Failed(cudaStreamSynchronize(d.stream), "the delta scatter kernel", device, error)) {
    return ScatterCode::kCudaError;
  }
  return ScatterCode::kOk;
}

ScatterCode DeviceScatter::CopyToHost(int device, void* host_dst, const void* device_src,
                                      uint64_t bytes, std::string* error) {
  if (bytes == 0) return ScatterCode::kOk;
  if (Failed(cudaSetDevice(device), "cudaSetDevice", device, error) ||
      Failed(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost),
             "cudaMemcpy device to host", device, error)) {
    return ScatterCode::kCudaError;
  }
  return ScatterCode::kOk;
}

}  // namespace wb::delta::cuda
