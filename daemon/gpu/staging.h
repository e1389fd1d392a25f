// GPU memory for the software transports (tcp, local): device bytes staged through a ring of
// pinned host buffers (cudaHostAlloc) on a CUDA stream of their own, pipelined so the copy of
// one chunk overlaps the host-side work (a socket send or receive) on the next. Without CUDA
// (staging_nocuda.cc) or without a device every call says why it cannot run.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/gpu/staging_pipeline.h"

namespace wb::gpu {

// Ok when device memory can be staged here; else FailedPrecondition "built without CUDA" or
// "no CUDA device (...)".
absl::Status StagingAvailable();

// Ok when [ptr, ptr + length) is device memory of CUDA device `device` (cudaMalloc'ed or
// opened through CUDA IPC); else InvalidArgument saying what the pointer is.
absl::Status CheckDeviceRange(const void* ptr, uint64_t length, int device);

// Copies between two ranges either of which may be device memory (cudaMemcpy with unified
// addressing; host ranges may be pageable) with `device` current (the device of the GPU side;
// never left to the thread's default, which would make a context on GPU 0). Synchronous: the
// copy has completed on the device when this returns (it is waited for on the stream it ran
// on), so a caller may tell another process the bytes are in place.
absl::Status CopyAnyToAny(void* dst, const void* src, uint64_t bytes, int device);

// One ring of pinned buffers and, per device used, a stream and one event per buffer. Used by
// one thread at a time (the tcp transport keeps one per connection thread).
class DeviceStaging {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceStaging>> Create(const StagingOptions& options = {});
  virtual ~DeviceStaging() = default;

  // Reads `length` bytes of device memory at `src` on `device`, chunk by chunk into `sink`.
  virtual absl::Status ReadFromDevice(int device, const uint8_t* src, uint64_t length,
                                      const ChunkSink& sink) = 0;
  // Writes `length` bytes to device memory at `dst` on `device`, chunk by chunk from `source`.
  virtual absl::Status WriteToDevice(int device, uint8_t* dst, uint64_t length,
                                     const ChunkSource& source) = 0;
  virtual const StagingOptions& options() const = 0;
};

// A DeviceStaging created on first use (pinned memory only for connections that carry GPU
// bytes); a failed creation is retried on the next use.
class LazyStaging {
 public:
  explicit LazyStaging(StagingOptions options = {}) : options_(options) {}
  // A staging made by the caller (tests: one over host memory, so that the tcp transport's GPU
  // path runs without a device).
  explicit LazyStaging(std::unique_ptr<DeviceStaging> staging) : staging_(std::move(staging)) {}
  absl::StatusOr<DeviceStaging*> Get() {
    if (!staging_) {
      auto created = DeviceStaging::Create(options_);
      if (!created.ok()) return created.status();
      staging_ = std::move(*created);
    }
    return staging_.get();
  }

 private:
  StagingOptions options_;
  std::unique_ptr<DeviceStaging> staging_;
};

}  // namespace wb::gpu
