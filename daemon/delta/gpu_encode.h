// Delta mode on GPU sources: the device half of encoding (compare the new version with the
// shadow on the device, count the changes per tile, scan, write gaps and values at the chosen
// index width, refresh the shadow). Plain C++ (no absl) so that nvcc never sees absl;
// gpu_encoder.h wraps it and assembles the packed form of delta_codec.h. Without the CUDA
// toolkit gpu_encode_nocuda.cc stands in and reports kBuiltWithoutCuda.
#pragma once

#include <cstdint>
#include <string>

namespace wb::delta::cuda {

// kSourceChanged: the source changed between the count and the write pass (the write pass
// found other changes than the count pass); nothing past the buffers was written, but the
// records and the shadow are torn: the op fails and the shadow must be seeded again.
enum class EncodeCode { kOk, kBuiltWithoutCuda, kCudaError, kSourceChanged };

struct ChangeCounts {
  uint64_t count = 0;    // changed elements
  uint64_t max_gap = 0;  // largest gap between consecutive changes (the first from index 0)
};

// Owns, for one device, a stream and the scratch of the last encode (grown as needed). Not
// thread-safe: one encoder per thread (or a lock around it).
class DeviceEncoder {
 public:
  explicit DeviceEncoder(int device) : device_(device) {}
  ~DeviceEncoder();
  DeviceEncoder(const DeviceEncoder&) = delete;
  DeviceEncoder& operator=(const DeviceEncoder&) = delete;

  // Pass 1: compares `bytes` bytes (a whole number of `elem_size` = 1, 2 or 4 byte elements)
  // of `shadow` and `next`, both readable by the device (device memory, or mapped pinned host
  // memory for the shadow). Leaves the per-tile results in the scratch for WriteRecords.
  EncodeCode CountChanges(const uint8_t* shadow, const uint8_t* next, uint64_t bytes, int elem_size,
                          ChangeCounts* counts, std::string* error);
  // Pass 2, right after CountChanges on the same buffers: writes counts->count gaps of
  // `index_width` bytes to `gaps_host` and the values to `values_host` (host memory), and makes
  // the shadow equal `next`. The kernel stores at most `count` records whatever it finds, and
  // checks its tiles against pass 1: kSourceChanged when they disagree.
  EncodeCode WriteRecords(uint8_t* shadow, const uint8_t* next, uint64_t bytes, int elem_size,
                          uint64_t count, int index_width, uint8_t* gaps_host, uint8_t* values_host,
                          std::string* error);
  // The dense outcome: copies `next` over the shadow.
  EncodeCode RefreshShadow(uint8_t* shadow, const uint8_t* next, uint64_t bytes,
                           std::string* error);

  // Shadow memory on this encoder's device: device memory, or pinned host memory mapped into
  // the device's address space (`*device_ptr` is what the kernels read). Free with FreeShadow.
  EncodeCode AllocateShadow(uint64_t bytes, bool host, void** device_ptr, std::string* error);
  // Frees with `device` current (never through a context on GPU 0 made for the purpose).
  static void FreeShadow(void* device_ptr, bool host, int device);
  // Copies between any two buffers (cudaMemcpyDefault), e.g. to seed or read back a shadow.
  EncodeCode Copy(void* dst, const void* src, uint64_t bytes, std::string* error);

  int device() const { return device_; }

 private:
  EncodeCode Prepare(std::string* error);
  EncodeCode EnsureScratch(void** buffer, uint64_t* capacity, uint64_t need, const char* what,
                           std::string* error);

  int device_;
  void* stream_ = nullptr;  // cudaStream_t
  void* scratch_ = nullptr;
  uint64_t scratch_capacity_ = 0;
  void* gaps_ = nullptr;
  uint64_t gaps_capacity_ = 0;
  void* values_ = nullptr;
  uint64_t values_capacity_ = 0;
};

}  // namespace wb::delta::cuda
