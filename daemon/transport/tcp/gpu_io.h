// The tcp transport's path for GPU memory: a WRITE payload read from device memory, or received
// into it, through the pinned staging ring of daemon/gpu/staging.h, so the device copy of one
// chunk overlaps the socket transfer of the next. Kept apart from the frame loops so they only
// gain a branch at the one place where payload bytes are touched.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "common/net/socket_util.h"
#include "daemon/gpu/staging.h"

namespace wb::transport::tcp {

// Sends the frame header `raw` (`raw_bytes` bytes) and then `length` bytes of device memory at
// `src` on CUDA device `device`; `progress` runs after every send. Socket errors come back as
// net::SendAll reports them; CUDA errors say "GPU staging: ...".
absl::Status SendDevicePayload(gpu::LazyStaging& staging, int fd, const uint8_t* raw,
                               size_t raw_bytes, int device, const uint8_t* src, uint64_t length,
                               const std::function<void()>& progress);

// Receives `length` bytes into device memory at `dst` on `device`, all of them by `deadline`
// (the whole-payload deadline host memory has: a trickling sender cannot keep the region
// pinned). Returns kOk, or the socket outcome that cut the payload off (kTimedOut once the
// deadline passed; `*received` bytes had arrived, `*error` holds errno); when the staging
// itself fails the outcome is kError and `*staging_error` says why.
net::RecvOutcome RecvDevicePayload(gpu::LazyStaging& staging, int fd, int device, uint8_t* dst,
                                   uint64_t length, std::chrono::steady_clock::time_point deadline,
                                   size_t* received, int* error, absl::Status* staging_error);

}  // namespace wb::transport::tcp
