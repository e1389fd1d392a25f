#include "daemon/service/step_link_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/steplink/link_cipher.h"

namespace wb::service {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

struct StepLinkServer::Conn {
  net::UniqueFd fd;  // read by the loop; written under mu; closed by the loop
  std::string peer;
  Clock::time_point accepted;
  uint64_t order = 0;  // accept order: the oldest goes first when there are too many
  // The loop's alone.
  bool authenticated = false;
  uint64_t commands = 0;  // run from this link
  std::string hello;
  steplink::FrameReader frames;
  // Open on the loop, Seal under mu (the two directions use separate contexts).
  std::optional<steplink::LinkCipher> cipher;
  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  std::string out ABSL_GUARDED_BY(mu);

  // Seals and sends `plain`; a link that cannot take it is shut down (the loop then closes it).
  void Send(std::string_view plain) {
    absl::MutexLock lock(&mu);
    if (closed) return;
    out.clear();
    absl::Status s = cipher->Seal(plain, &out);
    if (s.ok()) s = net::SendAll(fd.get(), out.data(), out.size());
    if (!s.ok()) {
      spdlog::warn("step link from {}: reply not sent ({}); closing it", peer,
                   std::string(s.message()));
      ::shutdown(fd.get(), SHUT_RDWR);
    }
  }
};

absl::StatusOr<std::unique_ptr<StepLinkServer>> StepLinkServer::Start(
    const StepLinkOptions& options, Runner run) {
  uint16_t port = 0;
  auto listener = net::ListenTcp({options.host, options.port}, &port);
  if (!listener.ok()) {
    return absl::UnavailableError(absl::StrCat("step links: ", listener.status().message()));
  }
  // Accept takes connections until EAGAIN.
  fcntl(listener->get(), F_SETFL, fcntl(listener->get(), F_GETFL) | O_NONBLOCK);
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd < 0 || wake_fd < 0) {
    const std::string why = std::strerror(errno);
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
    return absl::InternalError(absl::StrCat("step links: epoll / eventfd: ", why));
  }
  auto server = std::unique_ptr<StepLinkServer>(
      new StepLinkServer(options, std::move(run), std::move(*listener), port, epoll_fd, wake_fd));
  return server;
}

StepLinkServer::StepLinkServer(const StepLinkOptions& options, Runner run, net::UniqueFd listener,
                               uint16_t port, int epoll_fd, int wake_fd)
    : options_(options),
      run_(std::move(run)),
      listener_(std::move(listener)),
      port_(port),
      epoll_fd_(epoll_fd),
      wake_fd_(wake_fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listener_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listener_.get(), &ev);
  ev.data.ptr = &stop_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { Loop(); });
}

void StepLinkServer::Stop() {
  if (stop_.exchange(true)) return;
  const uint64_t one = 1;
  // One write to a fresh eventfd cannot overflow its counter: the loop wakes.
  if (::write(wake_fd_, &one, sizeof(one)) < 0) {
    spdlog::error("step links: waking the loop: {}", std::strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
  for (auto& [raw, conn] : conns_) Close(raw, "");
  conns_.clear();
  listener_.Reset();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

absl::StatusOr<StepLinkServer::Grant> StepLinkServer::Issue() {
  if (stop_.load()) return absl::UnavailableError("agent shutting down");
  auto id = steplink::RandomBytes(steplink::kLinkIdBytes);
  if (!id.ok()) return id.status();
  auto key = steplink::RandomBytes(steplink::kKeyBytes);
  if (!key.ok()) return key.status();
  const auto now = Clock::now();
  absl::MutexLock lock(&grants_mu_);
  for (auto it = grants_.begin(); it != grants_.end();) {
    it = now - it->second.issued > options_.grant_lifetime ? grants_.erase(it) : std::next(it);
  }
  while (static_cast<int>(grants_.size()) >= options_.max_grants) {
    auto oldest = grants_.begin();
    for (auto it = grants_.begin(); it != grants_.end(); ++it) {
      if (it->second.issued < oldest->second.issued) oldest = it;
    }
    grants_.erase(oldest);
  }
  grants_[*id] = {*key, now};
  return Grant{port_, std::move(*id), std::move(*key)};
}

int StepLinkServer::open_links() const { return open_links_.load(); }

void StepLinkServer::Loop() {
  epoll_event events[64];
  auto next_sweep = Clock::now();
  while (!stop_.load()) {
    // Handshakes in progress need their deadline checked; otherwise sleep until something
    // happens (hundreds of idle agents' links must not tick).
    bool handshaking = false;
    for (auto& [raw, conn] : conns_) handshaking = handshaking || !raw->authenticated;
    const int n = epoll_wait(epoll_fd_, events, 64, handshaking ? 250 : -1);
    if (n < 0 && errno != EINTR) {
      spdlog::error("step links: epoll_wait: {}; links stop", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &stop_) return;
      if (tag == &listener_) {
        Accept();
        continue;
      }
      auto it = conns_.find(static_cast<Conn*>(tag));
      if (it == conns_.end()) continue;  // closed by an earlier event of this batch
      std::shared_ptr<Conn> c = it->second;
      if (!Read(c)) {
        Close(c.get(), "");
        conns_.erase(c.get());
      }
    }
    if (Clock::now() >= next_sweep) {
      CloseExpiredHandshakes();
      next_sweep = Clock::now() + std::chrono::milliseconds(250);
    }
  }
}

void StepLinkServer::Accept() {
  while (true) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: the pending connection stays queued and the listener
        // readable, so back off instead of spinning on it; accepting resumes once it can.
        spdlog::warn("step links: accept: {}; retrying in 100 ms", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        spdlog::warn("step links: accept: {}", std::strerror(errno));
      }
      return;
    }
    auto c = std::make_shared<Conn>();
    c->fd = net::UniqueFd(fd);
    char host[64] = "?";
    if (addr.ss_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host, sizeof(host));
    } else if (addr.ss_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host, sizeof(host));
    }
    c->peer = host;
    c->accepted = Clock::now();
    c->order = ++next_order_;
    // Replies are written blocking, each bounded by the send timeout; reads never block
    // (MSG_DONTWAIT), so the socket itself is made blocking.
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    (void)net::TuneSocket(fd, 0, options_.send_timeout, std::chrono::milliseconds(0));
    // Too many handshakes at once: the oldest goes.
    int unauthenticated = 0;
    Conn* oldest = nullptr;
    for (auto& [raw, conn] : conns_) {
      if (raw->authenticated) continue;
      ++unauthenticated;
      if (oldest == nullptr || raw->order < oldest->order) oldest = raw;
    }
    if (oldest != nullptr && unauthenticated >= options_.max_unauthenticated) {
      Close(oldest, "too many connections in their handshake");
      conns_.erase(oldest);
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = c.get();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      spdlog::warn("step links: epoll_ctl: {}", std::strerror(errno));
      continue;  // c closes its fd
    }
    conns_[c.get()] = std::move(c);
  }
}

bool StepLinkServer::Read(const std::shared_ptr<Conn>& c) {
  char buf[64 * 1024];
  while (true) {
    // Before the handshake, no more than the hello: nothing else is buffered for a stranger.
    const size_t want = c->authenticated ? sizeof(buf) : steplink::kHelloBytes - c->hello.size();
    const ssize_t got = ::recv(c->fd.get(), buf, want, MSG_DONTWAIT);
    if (got == 0) return false;  // the controller closed the link
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    if (!c->authenticated) {
      c->hello.append(buf, static_cast<size_t>(got));
      if (c->hello.size() < steplink::kHelloBytes) continue;
      if (!Authenticate(c)) return false;
      continue;
    }
    c->frames.Append(buf, static_cast<size_t>(got));
    // A short read took all there was; epoll (level-triggered) reports whatever comes next.
    const bool drained = static_cast<size_t>(got) < want;
    absl::Status s = c->cipher->OpenEach(&c->frames, [&](const std::string& message) {
      v1::StepCommand command;
      if (!command.ParseFromString(message)) {
        return absl::DataLossError("a frame that is not a step command");
      }
      ++c->commands;
      run_(std::move(command), [c](v1::StepReply reply) { c->Send(reply.SerializeAsString()); });
      return absl::OkStatus();
    });
    if (!s.ok()) {
      spdlog::warn("step link from {}: {}; closing it", c->peer, std::string(s.message()));
      return false;
    }
    if (drained) return true;
  }
}

bool StepLinkServer::Authenticate(const std::shared_ptr<Conn>& c) {
  const std::string id = c->hello.substr(0, steplink::kLinkIdBytes);
  std::optional<PendingGrant> grant;
  {
    absl::MutexLock lock(&grants_mu_);
    auto it = grants_.find(id);
    if (it != grants_.end()) grant = it->second;
  }
  if (!grant || Clock::now() - grant->issued > options_.grant_lifetime) {
    spdlog::warn("step link from {}: unknown, used or expired link id; closing it", c->peer);
    return false;
  }
  // The key proof first: the id travels in clear, so a connection replaying it without the key
  // must not use the grant up (only the one that proves the key does).
  auto cipher = steplink::LinkCipher::Create(grant->key, steplink::Direction::kToController);
  if (!cipher.ok()) return false;
  c->cipher.emplace(std::move(*cipher));
  if (!c->cipher->OpenEmptyFrame(std::string_view(c->hello).substr(steplink::kLinkIdBytes)).ok()) {
    spdlog::warn("step link from {}: the hello does not prove the link's key; closing it", c->peer);
    return false;
  }
  {
    absl::MutexLock lock(&grants_mu_);
    auto it = grants_.find(id);
    if (it == grants_.end() || it->second.issued != grant->issued) {
      spdlog::warn("step link from {}: link id used meanwhile; closing it", c->peer);
      return false;
    }
    grants_.erase(it);  // one connection per grant
  }
  c->authenticated = true;
  c->hello.clear();
  c->Send("");  // the acknowledgement: commands sent from now on will run
  ++open_links_;
  spdlog::info("step link from {} open", c->peer);
  // A controller that opens a new link has given up its old ones (it restarted, or they broke).
  int open = 0;
  Conn* oldest = nullptr;
  for (auto& [raw, conn] : conns_) {
    if (!raw->authenticated) continue;
    ++open;
    if (raw != c.get() && (oldest == nullptr || raw->order < oldest->order)) oldest = raw;
  }
  if (oldest != nullptr && open > options_.max_links) {
    Close(oldest, "too many open step links");
    conns_.erase(oldest);
  }
  return true;
}

void StepLinkServer::Close(Conn* c, const std::string& why) {
  if (!why.empty()) spdlog::warn("step link from {}: {}; closing it", c->peer, why);
  absl::MutexLock lock(&c->mu);
  if (c->closed) return;
  c->closed = true;
  if (c->authenticated) {
    --open_links_;
    spdlog::info("step link from {} closed after {} command(s)", c->peer, c->commands);
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd.get(), nullptr);
  c->fd.Reset();
}

void StepLinkServer::CloseExpiredHandshakes() {
  const auto now = Clock::now();
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn* c = it->first;
    if (!c->authenticated && now - c->accepted > options_.handshake_timeout) {
      Close(c, "no valid hello within the handshake timeout");
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace wb::service
