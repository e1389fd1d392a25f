#include "daemon/local_api/unix_listener.h"

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace wb::local {

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Unix socket path ", path, " is longer than ", sizeof(addr.sun_path) - 1));
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) {
    int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on Unix socket ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<UnixListener>(new UnixListener(fd));
}

UnixListener::~UnixListener() {
  Stop();
  ::close(fd_);
}

void UnixListener::Start(grpc::Server* server) {
  acceptor_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixListener::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
  if (acceptor_.joinable()) acceptor_.join();
}

void UnixListener::AcceptLoop(grpc::Server* server) {
  while (!stopping_) {
    // Non-blocking: gRPC's poller expects it of every descriptor it is given.
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // EMFILE, ENFILE, ENOMEM, ENOBUFS: out of resources for now, not for good.
      spdlog::warn("Local socket: accept failed: {}; retrying in 100 ms", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("Local socket: SO_PEERCRED failed: {}; connection closed", std::strerror(errno));
      ::close(fd);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      by_fd_[fd] = registry::Caller{cred.pid, cred.uid, cred.gid, true};
    }
    grpc::AddInsecureChannelFromFd(server, fd);  // gRPC owns fd from here on
  }
}

std::optional<registry::Caller> UnixListener::Lookup(const std::string& grpc_peer) const {
  int fd = -1;
  if (grpc_peer.rfind("fd:", 0) != 0 || !absl::SimpleAtoi(grpc_peer.substr(3), &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

}  // namespace wb::local
