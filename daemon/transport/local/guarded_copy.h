// One write of the local transport where either side may be GPU memory. Host memory (a
// client's shared-memory object, which its owner may shrink) is touched only under the SIGBUS
// guard, and CUDA is called only outside it: a siglongjmp out of the CUDA driver would leave
// its locks held and the agent's next CUDA call hanging. Between host and device the bytes go
// through the pinned staging ring (daemon/gpu/staging.h), the host side of each chunk copied
// under the guard.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "daemon/gpu/staging_pipeline.h"
#include "daemon/transport/transport.h"

namespace wb::transport::local {

struct CopySide {
  uint8_t* data = nullptr;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // for kCuda
};

// The CUDA half of a copy: the staging ring and driver copies here, a fake in tests.
class DeviceCopies {
 public:
  virtual ~DeviceCopies() = default;
  // `source` fills each staged chunk (host side), then it goes to the device.
  virtual absl::Status ToDevice(int device, uint8_t* dst, uint64_t length,
                                const gpu::ChunkSource& source) = 0;
  // Each chunk comes from the device, then `sink` takes it (host side).
  virtual absl::Status FromDevice(int device, const uint8_t* src, uint64_t length,
                                  const gpu::ChunkSink& sink) = 0;
  // Device to device (peer copies included), with `device` current.
  virtual absl::Status DeviceToDevice(int device, uint8_t* dst, const uint8_t* src,
                                      uint64_t length) = 0;
};

// The CUDA implementation (a LazyStaging: pinned memory only once GPU bytes are copied). Used by
// one thread at a time.
std::unique_ptr<DeviceCopies> CudaDeviceCopies();

// Copies `length` bytes from `src` to `dst`. A SIGBUS on the host side gives FailedPrecondition
// "hit memory that is gone (SIGBUS: ...)"; CUDA errors are returned as they are.
absl::Status CopyGuarded(const CopySide& dst, const CopySide& src, uint64_t length,
                         DeviceCopies& gpu);

}  // namespace wb::transport::local
