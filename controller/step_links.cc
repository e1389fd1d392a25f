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
#include "common/parallel/parallel_for.h"
#include "common/steplink/link_cipher.h"
#include "daemon/transport/tcp/socket_util.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;
namespace tcp = wb::transport::tcp;

namespace {
// Asking for a link and connecting take at most this (or what is left of the step's timeout).
constexpr std::chrono::milliseconds kOpenTimeout{5000};
constexpr uint32_t kLinkEvents = EPOLLIN | EPOLLRDHUP;
}  // namespace

struct StepLinks::FanOut {
  explicit FanOut(size_t n) : answers(n), done(n, false), left(n) {}
  void Fill(size_t i, Answer answer) {
    if (done[i]) return;
    answers[i] = std::move(answer);
    done[i] = true;
    --left;
  }
  std::vector<Answer> answers;
  std::vector<bool> done;
  size_t left;
};

class StepLinks::Link {
 public:
  struct Waiter {
    FanOut* fan = nullptr;
    size_t index = 0;
  };

  Link(std::string endpoint, tcp::UniqueFd fd, steplink::LinkCipher cipher)
      : endpoint_(std::move(endpoint)), fd_(std::move(fd)), cipher_(std::move(cipher)) {}

  const std::string& endpoint() const { return endpoint_; }
  int fd() const { return fd_.get(); }
  bool acked() const { return acked_; }
  std::map<uint64_t, Waiter>& pending() { return pending_; }

  // The hello: the link id in clear, then a sealed empty frame that proves the key.
  absl::Status Hello(const std::string& link_id) {
    out_ = link_id;
    return cipher_.Seal("", &out_);
  }

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

  // Reads what has arrived and hands each reply to its waiter.
  absl::Status Read() {
    char buf[64 * 1024];
    while (true) {
      const ssize_t got = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (got == 0) return absl::UnavailableError("the agent closed its step link");
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
        return absl::UnavailableError(absl::StrCat("receive: ", std::strerror(errno)));
      }
      frames_.Append(buf, static_cast<size_t>(got));
      // A short read took all there was: epoll (level-triggered) reports whatever comes next,
      // so no second recv just to see EAGAIN.
      const bool drained = static_cast<size_t>(got) < sizeof(buf);
      while (true) {
        std::string_view body;
        auto has = frames_.Next(&body);
        if (!has.ok()) return has.status();
        if (!*has) break;
        if (auto s = cipher_.Open(body, &plain_); !s.ok()) return s;
        if (!acked_) {  // the agent's first frame: the link is accepted
          if (!plain_.empty())
            return absl::DataLossError("step link opened without its acknowledgement");
          acked_ = true;
          continue;
        }
        v1::StepReply reply;
        if (!reply.ParseFromString(plain_)) {
          return absl::DataLossError("a step link frame that is not a step reply");
        }
        Deliver(std::move(reply));
      }
      if (drained) return absl::OkStatus();
    }
  }

 private:
  void Deliver(v1::StepReply reply) {
    auto it = pending_.find(reply.seq());
    if (it == pending_.end()) return;  // late: nobody waits for it any more
    const Waiter w = it->second;
    pending_.erase(it);
    Answer answer;
    if (reply.code() != 0) {
      answer.status = grpc::Status(static_cast<grpc::StatusCode>(reply.code()), reply.error());
    }
    answer.reply = std::move(reply);
    w.fan->Fill(w.index, std::move(answer));
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
  tcp::UniqueFd fd_;
  steplink::LinkCipher cipher_;
  steplink::FrameReader frames_;
  std::string plain_;
  std::string out_;  // sealed bytes not yet sent, from sent_
  size_t sent_ = 0;
  bool acked_ = false;
  bool watching_out_ = false;
  std::map<uint64_t, Waiter> pending_;
};

StepLinks::StepLinks(AgentChannels* channels)
    : channels_(channels), epoll_fd_(epoll_create1(EPOLL_CLOEXEC)) {
  if (epoll_fd_ < 0) {
    spdlog::warn("step links off: epoll_create1: {}", std::strerror(errno));
  }
}

StepLinks::~StepLinks() {
  {
    absl::MutexLock lock(&drive_mu_);
    links_.clear();
    dropped_.clear();
  }
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

bool StepLinks::Links(const std::string& endpoint) const {
  if (epoll_fd_ < 0) return false;
  absl::MutexLock lock(&mu_);
  return !no_link_.count(endpoint);
}

void StepLinks::Reset(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  no_link_.erase(endpoint);
}

size_t StepLinks::open_links() const { return open_.load(); }

void StepLinks::NoLink(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  no_link_.insert(endpoint);
}

void StepLinks::Open(const std::vector<std::string>& endpoints, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  const auto timeout = std::clamp(left, std::chrono::milliseconds(1), kOpenTimeout);
  std::vector<CallTarget<v1::OpenStepLinkRequest>> targets;
  targets.reserve(endpoints.size());
  for (const auto& e : endpoints) targets.push_back({e, e, {}});
  auto granted = CallAll<v1::OpenStepLinkRequest, v1::OpenStepLinkResponse>(
      channels_, targets, timeout, [](auto* s, auto* c, const auto& q, auto* cq) {
        return s->PrepareAsyncOpenStepLink(c, q, cq);
      });
  // Connect to every agent that granted one, in parallel (a firewalled port costs its timeout
  // once, not once per agent).
  std::vector<tcp::HostPort> where(endpoints.size());
  std::vector<absl::StatusOr<tcp::UniqueFd>> fds;
  fds.reserve(endpoints.size());
  for (size_t i = 0; i < endpoints.size(); ++i) fds.emplace_back(absl::UnknownError("not asked"));
  std::vector<size_t> connect;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const auto& g = granted[i];
    if (!g.status.ok()) {
      const auto code = g.status.error_code();
      if (code == grpc::StatusCode::UNIMPLEMENTED ||
          code == grpc::StatusCode::FAILED_PRECONDITION) {
        spdlog::info(
            "agent at {} has no step links ({}): its step commands go on the gRPC step "
            "stream until it registers again",
            endpoints[i], g.status.error_message());
        NoLink(endpoints[i]);
      }
      continue;  // unreachable now: the stream says why, and the next step asks again
    }
    auto hp = tcp::ParseHostPort(endpoints[i]);
    if (!hp.ok() || g.response.port() == 0 || g.response.port() > 65535 ||
        g.response.link_id().size() != steplink::kLinkIdBytes ||
        g.response.key().size() != steplink::kKeyBytes) {
      spdlog::warn(
          "agent at {} answered OpenStepLink with an unusable grant; step commands go "
          "on its gRPC step stream",
          endpoints[i]);
      NoLink(endpoints[i]);
      continue;
    }
    where[i] = {hp->host, static_cast<uint16_t>(g.response.port())};
    connect.push_back(i);
  }
  const auto connect_timeout =
      std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                 std::chrono::milliseconds(1), kOpenTimeout);
  wb::ParallelFor(connect.size(), static_cast<int>(std::min<size_t>(connect.size(), 16)),
                  [&](uint64_t k) {
                    const size_t i = connect[k];
                    fds[i] = tcp::ConnectTcp(where[i], connect_timeout);
                  });
  for (size_t i : connect) {
    if (!fds[i].ok()) {
      spdlog::warn(
          "agent at {}: step link port {} unreachable ({}); its step commands go on the "
          "gRPC step stream until it registers again",
          endpoints[i], where[i].port, std::string(fds[i].status().message()));
      NoLink(endpoints[i]);
      continue;
    }
    tcp::UniqueFd fd = std::move(*fds[i]);
    const int flags = fcntl(fd.get(), F_GETFL);
    fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK);
    (void)tcp::TuneSocket(fd.get(), 0, std::chrono::milliseconds(0), std::chrono::milliseconds(0));
    auto cipher =
        steplink::LinkCipher::Create(granted[i].response.key(), steplink::Direction::kToAgent);
    if (!cipher.ok()) continue;
    auto link = std::make_unique<Link>(endpoints[i], std::move(fd), std::move(*cipher));
    epoll_event ev{};
    ev.events = kLinkEvents;
    ev.data.ptr = link.get();
    if (!link->Hello(granted[i].response.link_id()).ok() ||
        epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, link->fd(), &ev) != 0) {
      continue;
    }
    links_[endpoints[i]] = std::move(link);
  }
  open_ = links_.size();
}

void StepLinks::Drop(Link* link, const std::string& why, bool remember) {
  const bool acked = link->acked();
  if (!acked && remember) {
    spdlog::warn(
        "agent at {}: step link refused or broken before it was acknowledged ({}); its "
        "step commands go on the gRPC step stream until it registers again",
        link->endpoint(), why);
    NoLink(link->endpoint());
  }
  for (auto& [seq, w] : link->pending()) {
    Answer answer;
    if (acked) {
      answer.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("step link: ", why));
    } else {
      answer.not_sent = true;  // nothing runs before the acknowledgement
    }
    w.fan->Fill(w.index, std::move(answer));
  }
  link->pending().clear();
  auto it = links_.find(link->endpoint());
  if (it != links_.end() && it->second.get() == link) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, link->fd(), nullptr);
    dropped_.push_back(std::move(it->second));
    links_.erase(it);
  }
  open_ = links_.size();
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
      s = link->Read();
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
  // Links that ended (or late replies) since the last fan-out are known before they are used.
  for (int i = 0; i < 64 && Poll(deadline, false); ++i) {
  }
  std::vector<std::string> to_open;
  {
    std::set<std::string> asked;
    for (const auto& e : endpoints) {
      if (!links_.count(e) && Links(e) && asked.insert(e).second) to_open.push_back(e);
    }
  }
  if (!to_open.empty()) Open(to_open, deadline);
  std::vector<Link*> used(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    auto it = links_.find(endpoints[i]);
    if (it == links_.end()) {
      Answer not_sent;
      not_sent.not_sent = true;
      fan.Fill(i, std::move(not_sent));
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
    // command opens a new one.
    auto it = links_.find(endpoints[i]);
    if (it != links_.end() && it->second.get() == used[i])
      Drop(used[i], "no answer in time", false);
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
