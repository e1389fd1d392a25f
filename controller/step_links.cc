#include "controller/step_links.h"

#include <errno.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net/socket_util.h"
#include "common/parallel/parallel_for.h"
#include "common/steplink/link_cipher.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

namespace {
// The opener's bounds: OpenStepLink, then connecting and the handshake (each).
constexpr std::chrono::milliseconds kGrantTimeout{3000};
constexpr std::chrono::milliseconds kConnectTimeout{2000};
// An agent that did not answer OpenStepLink, or whose link could not be made (a handshake that
// met a long command on the agent's link thread, a port not reachable yet), is asked again no
// sooner than this, doubled after each failure in a row up to kMaxRetryAfter.
constexpr std::chrono::milliseconds kRetryAfter{1000};
constexpr std::chrono::milliseconds kMaxRetryAfter{30000};
// What one link's reader takes per wake-up: an agent flooding frames (valid ones included)
// cannot keep the driving thread; epoll (level-triggered) reports the rest on the next pass.
constexpr size_t kReadPerWake = 256 << 10;
// Before a fan-out's commands go out, at most this long is spent on what arrived since the
// last one (late replies, links that ended).
constexpr std::chrono::milliseconds kDrainBudget{20};
constexpr uint32_t kLinkEvents = EPOLLIN | EPOLLRDHUP;

// The handshake on a blocking socket: the hello out, the agent's sealed empty frame back.
absl::Status Handshake(int fd, const std::string& link_id, steplink::LinkCipher* cipher) {
  std::string hello = link_id;
  if (auto s = cipher->Seal("", &hello); !s.ok()) return s;
  if (auto s = net::SendAll(fd, hello.data(), hello.size()); !s.ok()) return s;
  char ack[steplink::kLengthBytes + steplink::kTagBytes];
  size_t got = 0;
  int error = 0;
  if (net::RecvExact(fd, ack, sizeof(ack), &got, &error) != net::RecvOutcome::kOk) {
    return absl::UnavailableError(
        absl::StrCat("no acknowledgement (", got, " of ", sizeof(ack), " bytes",
                     error ? absl::StrCat(": ", std::strerror(error)) : std::string(),
                     "): the agent refused the link"));
  }
  return cipher->OpenEmptyFrame(std::string_view(ack, sizeof(ack)));
}
}  // namespace

using FanOut = StepFanOut;

// One agent's link after its handshake. Only the driving thread touches it.
class StepLinks::Link {
 public:
  struct Waiter {
    FanOut* fan = nullptr;
    size_t index = 0;
  };

  Link(std::string endpoint, net::UniqueFd fd, steplink::LinkCipher cipher)
      : endpoint_(std::move(endpoint)), fd_(std::move(fd)), cipher_(std::move(cipher)) {}

  const std::string& endpoint() const { return endpoint_; }
  int fd() const { return fd_.get(); }
  std::map<uint64_t, Waiter>& pending() { return pending_; }

  absl::Status Queue(const v1::StepCommand& command, FanOut* fan, size_t index) {
    if (auto s = cipher_.Seal(command.SerializeAsString(), &out_); !s.ok()) return s;
    pending_[command.seq()] = {fan, index};
    return absl::OkStatus();
  }

  // Sends what it can without blocking; asks epoll for writability when the socket is full.
  absl::Status Flush(int epoll_fd) {
    while (sent_ < out_.size()) {
      const ssize_t n =
          ::send(fd_.get(), out_.data() + sent_, out_.size() - sent_, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n >= 0) {
        sent_ += static_cast<size_t>(n);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
      }
      return Watch(epoll_fd, true);
    }
    out_.clear();
    sent_ = 0;
    return Watch(epoll_fd, false);
  }

  // Reads what has arrived, at most kReadPerWake bytes and nothing more once `deadline` has
  // passed, and hands each reply to its waiter.
  absl::Status Read(Clock::time_point deadline) {
    char buf[64 * 1024];
    for (size_t taken = 0; taken < kReadPerWake; taken += sizeof(buf)) {
      const ssize_t got = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (got == 0) return absl::UnavailableError("the agent closed its step link");
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
        return absl::UnavailableError(absl::StrCat("receive: ", std::strerror(errno)));
      }
      frames_.Append(buf, static_cast<size_t>(got));
      absl::Status s = cipher_.OpenEach(&frames_, [this](const std::string& message) {
        v1::StepReply reply;
        if (!reply.ParseFromString(message)) {
          return absl::DataLossError("a step link frame that is not a step reply");
        }
        Deliver(std::move(reply));
        return absl::OkStatus();
      });
      if (!s.ok()) return s;
      // A short read took all there was: epoll (level-triggered) reports whatever comes next,
      // so no second recv just to see EAGAIN.
      if (static_cast<size_t>(got) < sizeof(buf)) return absl::OkStatus();
      if (Clock::now() >= deadline) return absl::OkStatus();
    }
    return absl::OkStatus();  // more is there: the next pass takes it
  }

 private:
  void Deliver(v1::StepReply reply) {
    auto it = pending_.find(reply.seq());
    if (it == pending_.end()) return;  // late: nobody waits for it any more
    const Waiter w = it->second;
    pending_.erase(it);
    w.fan->FillFromReply(w.index, std::move(reply));
  }

  absl::Status Watch(int epoll_fd, bool out) {
    if (out == watching_out_) return absl::OkStatus();
    epoll_event ev{};
    ev.events = kLinkEvents | (out ? EPOLLOUT : 0u);
    ev.data.ptr = this;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd_.get(), &ev) != 0) {
      return absl::InternalError(absl::StrCat("epoll_ctl: ", std::strerror(errno)));
    }
    watching_out_ = out;
    return absl::OkStatus();
  }

  const std::string endpoint_;
  net::UniqueFd fd_;
  steplink::LinkCipher cipher_;
  steplink::FrameReader frames_;
  std::string out_;  // sealed bytes not yet sent, from sent_
  size_t sent_ = 0;
  bool watching_out_ = false;
  std::map<uint64_t, Waiter> pending_;
};

StepLinks::StepLinks(AgentChannels* channels)
    : channels_(channels), epoll_fd_(epoll_create1(EPOLL_CLOEXEC)) {
  if (epoll_fd_ < 0) {
    spdlog::warn("step links off: epoll_create1: {}", std::strerror(errno));
    return;
  }
  opener_ = std::thread([this] { OpenLoop(); });
}

StepLinks::~StepLinks() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (opener_.joinable()) opener_.join();
  {
    absl::MutexLock lock(&drive_mu_);
    links_.clear();
    dropped_.clear();
  }
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

bool StepLinks::Has(const std::string& endpoint) const {
  absl::MutexLock lock(&mu_);
  return linked_.count(endpoint) > 0;
}

bool StepLinks::Links(const std::string& endpoint) const {
  if (epoll_fd_ < 0) return false;
  absl::MutexLock lock(&mu_);
  return !no_link_.count(endpoint);
}

void StepLinks::Reset(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  no_link_.erase(endpoint);
  retry_at_.erase(endpoint);
  failures_.erase(endpoint);
}

size_t StepLinks::open_links() const {
  absl::MutexLock lock(&mu_);
  return linked_.size();
}

void StepLinks::Request(const std::vector<std::string>& endpoints) {
  if (epoll_fd_ < 0) return;
  const auto now = Clock::now();
  absl::MutexLock lock(&mu_);
  for (const auto& e : endpoints) {
    if (e.empty() || no_link_.count(e) || linked_.count(e) || opening_.count(e)) continue;
    auto retry = retry_at_.find(e);
    if (retry != retry_at_.end() && retry->second > now) continue;
    opening_.insert(e);
    requests_.push_back(e);
  }
}

void StepLinks::NoLink(const std::string& endpoint, const std::string& why, bool refused) {
  // An agent that refuses links was set up that way (or is an older build); one whose link
  // could not be made is worth a warning (a firewall, most likely).
  spdlog::log(refused ? spdlog::level::info : spdlog::level::warn,
              "agent at {}: no step link ({}); its step commands go on the gRPC step stream "
              "until it registers again",
              endpoint, why);
  absl::MutexLock lock(&mu_);
  no_link_.insert(endpoint);
}

void StepLinks::OpenLoop() {
  while (true) {
    std::vector<std::string> batch;
    {
      absl::MutexLock lock(&mu_);
      // Await re-checks the condition whenever another thread releases mu_ (a Request, the
      // destructor).
      mu_.Await(absl::Condition(
          +[](StepLinks* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || !self->requests_.empty();
          },
          this));
      if (stopping_) return;
      batch.assign(requests_.begin(), requests_.end());
      requests_.clear();
    }
    if (!batch.empty()) Open(batch);
  }
}

void StepLinks::Open(const std::vector<std::string>& endpoints) {
  std::vector<CallTarget<v1::OpenStepLinkRequest>> targets;
  targets.reserve(endpoints.size());
  for (const auto& e : endpoints) targets.push_back({e, e, {}});
  auto granted = CallAll<v1::OpenStepLinkRequest, v1::OpenStepLinkResponse>(
      channels_, targets, kGrantTimeout, [](auto* s, auto* c, const auto& q, auto* cq) {
        return s->PrepareAsyncOpenStepLink(c, q, cq);
      });
  // Connect and shake hands with every agent that granted one, in parallel (a firewalled port
  // costs its timeout once, not once per agent).
  std::vector<std::unique_ptr<Link>> made(endpoints.size());
  std::vector<std::string> failed(endpoints.size());  // why there is no link, for good
  std::vector<bool> refused(endpoints.size(), false), retry(endpoints.size(), false);
  std::vector<size_t> connect;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const auto& g = granted[i];
    if (!g.status.ok()) {
      const auto code = g.status.error_code();
      if (code == grpc::StatusCode::UNIMPLEMENTED ||
          code == grpc::StatusCode::FAILED_PRECONDITION) {
        failed[i] = absl::StrCat("OpenStepLink: ", g.status.error_message());
        refused[i] = true;
      } else {
        retry[i] = true;  // not reachable now: the stream says why; asked again later
      }
      continue;
    }
    if (g.response.port() == 0 || g.response.port() > 65535 ||
        g.response.link_id().size() != steplink::kLinkIdBytes ||
        g.response.key().size() != steplink::kKeyBytes) {
      failed[i] = "OpenStepLink answered an unusable grant";
      continue;
    }
    connect.push_back(i);
  }
  ParallelFor(
      connect.size(), static_cast<int>(std::min<size_t>(connect.size(), 16)), [&](uint64_t k) {
        const size_t i = connect[k];
        const auto& grant = granted[i].response;
        auto hp = net::ParseHostPort(endpoints[i]);
        if (!hp.ok()) {
          failed[i] = std::string(hp.status().message());
          return;
        }
        hp->port = static_cast<uint16_t>(grant.port());
        auto fd = net::ConnectTcp(*hp, kConnectTimeout);
        if (!fd.ok()) {
          failed[i] = absl::StrCat("link port ", grant.port(), ": ", fd.status().message());
          return;
        }
        auto cipher = steplink::LinkCipher::Create(grant.key(), steplink::Direction::kToAgent);
        absl::Status s = cipher.status();
        if (s.ok()) s = net::TuneSocket(fd->get(), 0, kConnectTimeout, kConnectTimeout);
        if (s.ok()) s = Handshake(fd->get(), grant.link_id(), &*cipher);
        if (!s.ok()) {
          failed[i] = absl::StrCat("link port ", grant.port(), ": ", s.message());
          return;
        }
        // From now on the driving thread reads and writes it without blocking.
        fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
        made[i] = std::make_unique<Link>(endpoints[i], std::move(*fd), std::move(*cipher));
      });
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (!failed[i].empty() && refused[i]) NoLink(endpoints[i], failed[i], true);
  }
  const auto now = Clock::now();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const std::string& e = endpoints[i];
    opening_.erase(e);
    if (made[i]) {
      failures_.erase(e);
      linked_.insert(e);
      ready_.push_back(std::move(made[i]));
      continue;
    }
    if (refused[i] || (failed[i].empty() && !retry[i])) continue;
    // Not made this time: asked again after a backoff (the stream carries its commands).
    const int n = std::min(++failures_[e], 16);
    const auto wait =
        std::min<std::chrono::milliseconds>(kRetryAfter * (1 << (n - 1)), kMaxRetryAfter);
    retry_at_[e] = now + wait;
    if (!failed[i].empty()) {
      spdlog::warn(
          "agent at {}: no step link ({}); its step commands go on the gRPC step stream; "
          "trying again in {} ms",
          e, failed[i], wait.count());
    }
  }
}

void StepLinks::Install() {
  std::vector<std::unique_ptr<Link>> ready;
  {
    absl::MutexLock lock(&mu_);
    ready.swap(ready_);
  }
  for (auto& link : ready) {
    epoll_event ev{};
    ev.events = kLinkEvents;
    ev.data.ptr = link.get();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, link->fd(), &ev) != 0) {
      spdlog::warn("agent at {}: step link not used: epoll_ctl: {}", link->endpoint(),
                   std::strerror(errno));
      absl::MutexLock lock(&mu_);
      linked_.erase(link->endpoint());
      continue;
    }
    const std::string endpoint = link->endpoint();
    links_[endpoint] = std::move(link);  // replaces (closes) an older one, if any
  }
}

void StepLinks::Drop(Link* link, const std::string& why) {
  for (auto& [seq, w] : link->pending()) {
    w.fan->Fill(
        w.index,
        {grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("step link: ", why)), {}, false});
  }
  link->pending().clear();
  auto it = links_.find(link->endpoint());
  if (it != links_.end() && it->second.get() == link) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, link->fd(), nullptr);
    {
      absl::MutexLock lock(&mu_);
      linked_.erase(link->endpoint());
    }
    dropped_.push_back(std::move(it->second));
    links_.erase(it);
  }
}

bool StepLinks::Poll(Clock::time_point deadline, bool wait) {
  int timeout_ms = 0;
  if (wait) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return false;
    timeout_ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
  }
  epoll_event events[256];
  const int n = epoll_wait(epoll_fd_, events, 256, timeout_ms);
  if (n < 0) return errno == EINTR;  // a signal: look again (the deadline still holds)
  if (n == 0) return false;
  for (int i = 0; i < n; ++i) {
    auto* link = static_cast<Link*>(events[i].data.ptr);
    // Dropped earlier in this batch: its events are stale.
    if (std::any_of(dropped_.begin(), dropped_.end(),
                    [&](const auto& d) { return d.get() == link; })) {
      continue;
    }
    absl::Status s;
    if (events[i].events & EPOLLOUT) s = link->Flush(epoll_fd_);
    if (s.ok() && (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
      s = link->Read(deadline);
    }
    if (!s.ok()) Drop(link, std::string(s.message()));
  }
  dropped_.clear();
  return true;
}

std::vector<StepLinks::Answer> StepLinks::Send(const std::vector<std::string>& endpoints,
                                               std::vector<v1::StepCommand>* commands,
                                               std::chrono::milliseconds timeout) {
  const size_t n = endpoints.size();
  FanOut fan(n);
  if (n == 0) return {};
  const auto deadline = Clock::now() + timeout;
  absl::MutexLock lock(&drive_mu_);
  if (epoll_fd_ >= 0) {
    Install();
    // Links that ended (or late replies) since the last fan-out are known before they are used;
    // within a small budget, so that no link's traffic delays the commands.
    const auto drain_by = std::min(deadline, Clock::now() + kDrainBudget);
    for (int i = 0; i < 64 && Clock::now() < drain_by && Poll(drain_by, false); ++i) {
    }
  }
  std::vector<Link*> used(n, nullptr);
  std::vector<std::string> unlinked;
  for (size_t i = 0; i < n; ++i) {
    auto it = links_.find(endpoints[i]);
    if (it == links_.end()) {
      unlinked.push_back(endpoints[i]);
      fan.Fill(i, {grpc::Status::OK, {}, /*not_sent=*/true});
      continue;
    }
    v1::StepCommand& command = (*commands)[i];
    command.set_seq(next_seq_++);
    if (auto s = it->second->Queue(command, &fan, i); !s.ok()) {
      fan.Fill(i, {grpc::Status(grpc::StatusCode::INTERNAL, std::string(s.message())), {}, false});
      continue;
    }
    used[i] = it->second.get();
  }
  Request(unlinked);
  // Each link's commands leave in one send.
  std::vector<Link*> flush(used.begin(), used.end());
  std::sort(flush.begin(), flush.end());
  flush.erase(std::unique(flush.begin(), flush.end()), flush.end());
  for (Link* link : flush) {
    if (link == nullptr) continue;
    if (auto s = link->Flush(epoll_fd_); !s.ok()) Drop(link, std::string(s.message()));
  }
  dropped_.clear();
  while (fan.left > 0 && Poll(deadline, true)) {
  }
  for (size_t i = 0; i < n; ++i) {
    if (fan.done[i]) continue;
    fan.Fill(i,
             {grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"), {}, false});
    // No answer in time: the agent may be wedged or the link half-open. It is closed; the next
    // fan-out sends on the stream while a new link is opened.
    auto it = links_.find(endpoints[i]);
    if (it != links_.end() && it->second.get() == used[i]) Drop(used[i], "no answer in time");
  }
  dropped_.clear();
  // Answers that come late find no fan-out.
  for (auto& [endpoint, link] : links_) {
    auto& pending = link->pending();
    for (auto it = pending.begin(); it != pending.end();) {
      it = it->second.fan == &fan ? pending.erase(it) : std::next(it);
    }
  }
  return std::move(fan.answers);
}

}  // namespace wb::controller
