// Small POSIX socket helpers for the tcp transport and the step links (agent and controller): an
// owning fd, listen/connect with timeouts, and exact send/receive loops that survive partial
// transfers and EINTR.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wb::net {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

// "host:port" or "[v6]:port"; port 0 allowed.
absl::StatusOr<HostPort> ParseHostPort(const std::string& text);
std::string FormatHostPort(const std::string& host, uint16_t port);

// Binds and listens; `*bound_port` receives the port (useful with port 0).
absl::StatusOr<UniqueFd> ListenTcp(const HostPort& where, uint16_t* bound_port);
absl::StatusOr<UniqueFd> ConnectTcp(const HostPort& where, std::chrono::milliseconds timeout);

// TCP_NODELAY, optional buffer sizes (0 keeps the kernel's autotuning), and send/receive
// timeouts (0: none) after which a call that made no progress fails.
absl::Status TuneSocket(int fd, int buffer_bytes, std::chrono::milliseconds send_timeout,
                        std::chrono::milliseconds recv_timeout);

// Sends every byte of `iov` (modified in place). Fails on error or when a send timeout
// passes without progress.
absl::Status SendAll(int fd, struct iovec* iov, int iovcnt);
absl::Status SendAll(int fd, const void* data, size_t size);

enum class RecvOutcome { kOk, kClosed, kTimedOut, kError };
// Receives exactly `size` bytes. kTimedOut: the receive timeout passed without any new byte
// (`*received` says how many arrived before). kClosed: orderly shutdown by the peer.
RecvOutcome RecvExact(int fd, void* data, size_t size, size_t* received, int* error);
// The same, but kTimedOut also once `deadline` has passed with bytes still missing, however
// steadily they trickle in (each recv is bounded by the socket's receive timeout, so the call
// ends at most that long after `deadline`).
RecvOutcome RecvExactBy(int fd, void* data, size_t size,
                        std::chrono::steady_clock::time_point deadline, size_t* received,
                        int* error);

}  // namespace wb::net
