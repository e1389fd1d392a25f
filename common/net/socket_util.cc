#include "common/net/socket_util.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace wb::net {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};

absl::StatusOr<std::unique_ptr<addrinfo, AddrInfoDeleter>> Resolve(const HostPort& where,
                                                                   bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string port = std::to_string(where.port);
  const char* host = where.host.empty() ? nullptr : where.host.c_str();
  int rc = getaddrinfo(host, port.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve ", FormatHostPort(where.host, where.port), ": ", gai_strerror(rc)));
  }
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(result);
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& text) {
  HostPort out;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("bad address '", text, "': want [v6]:port"));
    }
    out.host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad address '", text, "': want host:port"));
    }
    out.host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad port in address '", text, "'"));
  }
  out.port = static_cast<uint16_t>(port);
  return out;
}

std::string FormatHostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<UniqueFd> ListenTcp(const HostPort& where, uint16_t* bound_port) {
  auto resolved = Resolve(where, /*passive=*/true);
  if (!resolved.ok()) return resolved.status();
  int last_error = 0;
  for (addrinfo* ai = resolved->get(); ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last_error = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
      last_error = errno;
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    *bound_port =
        ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    return fd;
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot listen on ", FormatHostPort(where.host, where.port), ": ", ErrnoText(last_error)));
}

absl::StatusOr<UniqueFd> ConnectTcp(const HostPort& where, std::chrono::milliseconds timeout) {
  auto resolved = Resolve(where, /*passive=*/false);
  if (!resolved.ok()) return resolved.status();
  std::string last_error = "no address";
  for (addrinfo* ai = resolved->get(); ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) {
      last_error = ErrnoText(errno);
      continue;
    }
    int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd.get(), POLLOUT, 0};
      rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
      if (rc == 0) {
        last_error = absl::StrCat("timed out after ", timeout.count(), " ms");
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (rc < 0 || err != 0) {
        last_error = ErrnoText(rc < 0 ? errno : err);
        continue;
      }
    } else if (rc != 0) {
      last_error = ErrnoText(errno);
      continue;
    }
    int flags = fcntl(fd.get(), F_GETFL);
    fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
    return fd;
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to ", FormatHostPort(where.host, where.port), ": ", last_error));
}

absl::Status TuneSocket(int fd, int buffer_bytes, std::chrono::milliseconds send_timeout,
                        std::chrono::milliseconds recv_timeout) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return absl::InternalError(absl::StrCat("TCP_NODELAY: ", ErrnoText(errno)));
  }
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
  auto set_timeout = [fd](int option, std::chrono::milliseconds t) {
    timeval tv{};  // zero: block without limit
    if (t.count() <= 0) return setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
    tv.tv_sec = t.count() / 1000;
    tv.tv_usec = (t.count() % 1000) * 1000;
    return setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
  };
  if (set_timeout(SO_SNDTIMEO, send_timeout) != 0 || set_timeout(SO_RCVTIMEO, recv_timeout) != 0) {
    return absl::InternalError(absl::StrCat("socket timeout: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status SendAll(int fd, struct iovec* iov, int iovcnt) {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = iovcnt;
    ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError("send made no progress within the write timeout");
      }
      return absl::UnavailableError(absl::StrCat("send failed: ", ErrnoText(errno)));
    }
    size_t left = static_cast<size_t>(sent);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status SendAll(int fd, const void* data, size_t size) {
  iovec iov{const_cast<void*>(data), size};
  return SendAll(fd, &iov, 1);
}

RecvOutcome RecvExact(int fd, void* data, size_t size, size_t* received, int* error) {
  return RecvExactBy(fd, data, size, std::chrono::steady_clock::time_point::max(), received, error);
}

RecvOutcome RecvExactBy(int fd, void* data, size_t size,
                        std::chrono::steady_clock::time_point deadline, size_t* received,
                        int* error) {
  auto* out = static_cast<uint8_t*>(data);
  size_t got = 0;
  RecvOutcome outcome = RecvOutcome::kOk;
  while (got < size) {
    ssize_t n = ::recv(fd, out + got, size - got, MSG_WAITALL);
    if (n > 0) {
      got += static_cast<size_t>(n);
      // MSG_WAITALL returns short only after a signal or the receive timeout: the clock is
      // read off the fast path.
      if (got < size && std::chrono::steady_clock::now() >= deadline) {
        outcome = RecvOutcome::kTimedOut;
        break;
      }
      continue;
    }
    if (n == 0) {
      outcome = RecvOutcome::kClosed;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      outcome = RecvOutcome::kTimedOut;
      break;
    }
    if (error != nullptr) *error = errno;
    outcome = RecvOutcome::kError;
    break;
  }
  if (received != nullptr) *received = got;
  return outcome;
}

}  // namespace wb::net
