#include "daemon/transport/tcp/gpu_io.h"

#include <sys/uio.h>

#include "absl/strings/str_cat.h"

namespace wb::transport::tcp {

absl::Status SendDevicePayload(gpu::LazyStaging& staging, int fd, const uint8_t* raw,
                               size_t raw_bytes, int device, const uint8_t* src, uint64_t length,
                               const std::function<void()>& progress) {
  auto ring = staging.Get();
  if (!ring.ok()) return ring.status();
  bool header_sent = false;
  return (*ring)->ReadFromDevice(device, src, length,
                                 [&](const uint8_t* data, uint64_t, uint64_t bytes) {
                                   absl::Status st;
                                   if (!header_sent) {
                                     // The header rides with the first chunk, as in the host path.
                                     iovec iov[2] = {{const_cast<uint8_t*>(raw), raw_bytes},
                                                     {const_cast<uint8_t*>(data), bytes}};
                                     st = net::SendAll(fd, iov, 2);
                                     header_sent = true;
                                   } else {
                                     st = net::SendAll(fd, data, bytes);
                                   }
                                   if (st.ok()) progress();
                                   return st;
                                 });
}

net::RecvOutcome RecvDevicePayload(gpu::LazyStaging& staging, int fd, int device, uint8_t* dst,
                                   uint64_t length, std::chrono::steady_clock::time_point deadline,
                                   size_t* received, int* error, absl::Status* staging_error) {
  *received = 0;
  auto ring = staging.Get();
  if (!ring.ok()) {
    *staging_error = ring.status();
    return net::RecvOutcome::kError;
  }
  net::RecvOutcome outcome = net::RecvOutcome::kOk;
  absl::Status st =
      (*ring)->WriteToDevice(device, dst, length, [&](uint8_t* data, uint64_t, uint64_t bytes) {
        size_t got = 0;
        outcome = net::RecvExactBy(fd, data, bytes, deadline, &got, error);
        *received += got;
        if (outcome != net::RecvOutcome::kOk) return absl::UnavailableError("socket");
        return absl::OkStatus();
      });
  if (outcome != net::RecvOutcome::kOk) return outcome;
  if (!st.ok()) {
    *staging_error = st;
    return net::RecvOutcome::kError;
  }
  return net::RecvOutcome::kOk;
}

}  // namespace wb::transport::tcp
