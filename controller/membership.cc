#include "controller/membership.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/identity/incarnation_digest.h"
#include "common/process/malloc_arenas.h"
#include "common/tensor/tensor_checks.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

namespace {
// Frees a replaced layout (outside the lock). Past 10^4 tensors, what it held goes back to the
// kernel: the next report is parsed on another gRPC thread and would grow the heap again.
void Release(std::shared_ptr<const v1::AgentLayout> old) {
  const int tensors = old ? old->tensors_size() : 0;
  const bool last = old.use_count() == 1;  // a plan being made may still hold it
  old.reset();
  if (last && tensors >= 10000) ReturnFreeMemory();
}
}  // namespace

absl::Status CheckLayout(const std::string& agent, const v1::AgentLayout& layout) {
  for (const auto& t : layout.tensors()) {
    if (auto s = registry::ValidateTensorSpec(t.spec(), t.region().length()); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("agent ", agent, " reported an invalid layout: ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string PeerHost(const std::string& peer) {
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    const std::string prefix = scheme;
    if (peer.rfind(prefix, 0) != 0) continue;
    const std::string address = peer.substr(prefix.size());
    const auto colon = address.rfind(':');
    return colon == std::string::npos ? address : address.substr(0, colon);
  }
  return peer;
}

Membership::Membership(uint64_t epoch, std::chrono::milliseconds heartbeat_timeout)
    : epoch_(epoch), heartbeat_timeout_(heartbeat_timeout) {}

absl::Status Membership::Register(const v1::AgentInfo& info, v1::AgentLayout layout,
                                  const std::string& incarnation, const std::string& caller_host,
                                  const std::function<bool()>& endpoint_answers_as_caller,
                                  const HolderAnswer& holder_answer) {
  bool held = false, restart_claimed = false;
  std::string holder, holder_incarnation;
  {
    absl::MutexLock lock(&mu_);
    auto it = agents_.find(info.name());
    held = it != agents_.end() && !it->second.lost && it->second.incarnation != incarnation;
    // A new incarnation at the same endpoint of the same host claims to be the agent restarted
    // (systemd's Restart=on-failure): waiting out the old one's heartbeat timeout would fail
    // every step meanwhile, with the old plan and introductions pointing at a process gone.
    restart_claimed = held && !caller_host.empty() && it->second.caller_host == caller_host &&
                      it->second.info.control_endpoint() == info.control_endpoint();
    if (held) {
      holder = it->second.info.control_endpoint();
      holder_incarnation = it->second.incarnation;
    }
  }
  // The claim is believed only if the process listening on that endpoint answers with the
  // registering incarnation's digest (asked outside the lock: it is a network call). A live old
  // process still holds the port and answers with its own.
  const bool restarted =
      restart_claimed && endpoint_answers_as_caller && endpoint_answers_as_caller();
  // Elsewhere (a restart on a new address): the holder is gone when nothing answers at its
  // endpoint, or another incarnation does; waiting for its heartbeat timeout would keep the
  // restarted agent out (and its replica or every step with it) for nothing.
  bool holder_gone = false;
  if (held && !restart_claimed && holder_answer) {
    const std::optional<std::string> answer = holder_answer(holder);
    holder_gone = !answer.has_value() ||
                  (!answer->empty() && *answer != identity::IncarnationDigest(holder_incarnation));
    if (holder_gone) {
      absl::MutexLock lock(&mu_);
      auto it = agents_.find(info.name());
      // Another registration may have taken the name meanwhile: only the probed one goes.
      holder_gone = it != agents_.end() && it->second.incarnation == holder_incarnation;
    }
    if (holder_gone) {
      spdlog::warn(
          "agent '{}' registers from {}; {} at {}: its old incarnation is gone, the name is "
          "released",
          info.name(), info.control_endpoint(),
          answer.has_value() ? "another incarnation answers" : "nothing answers", holder);
    }
  }
  if (held && !restarted && !holder_gone) {
    spdlog::warn(
        "refused RegisterAgent for '{}' from {}: a live agent at {} holds the name{}", info.name(),
        info.control_endpoint(), holder,
        restart_claimed ? " (the process at that endpoint is not the one registering)" : "");
    return absl::AlreadyExistsError(
        absl::StrCat("agent name '", info.name(), "' is held by a live agent at ", holder,
                     "; another process may take it only after that one "
                     "is lost (no heartbeat for ",
                     heartbeat_timeout_.count(), " ms)"));
  }
  const int tensors = layout.tensors_size();
  auto shared = std::make_shared<v1::AgentLayout>(std::move(layout));
  shared->set_agent(info.name());
  std::shared_ptr<const v1::AgentLayout> old;  // freed outside the lock
  {
    absl::MutexLock lock(&mu_);
    AgentRecord& r = agents_[info.name()];
    const bool rejoined = r.lost;
    r.info = info;
    r.incarnation = incarnation;
    r.caller_host = caller_host;
    old = std::move(r.layout);
    r.layout = std::move(shared);
    r.last_seen = Clock::now();
    r.lost = false;
    ++layout_version_;
    spdlog::info("agent {} registered{} from {} ({} tensors, {} NICs)", info.name(),
                 restarted     ? " again: restarted (new incarnation at the same endpoint)"
                 : holder_gone ? " again: restarted elsewhere (its old incarnation is gone)"
                 : rejoined    ? " again"
                               : "",
                 info.control_endpoint(), tensors, info.nics_size());
  }
  Release(std::move(old));
  return absl::OkStatus();
}

bool Membership::IsIncarnation(const std::string& agent, const std::string& incarnation) const {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(agent);
  return it != agents_.end() && it->second.incarnation == incarnation;
}

v1::HeartbeatResponse Membership::Heartbeat(const v1::HeartbeatRequest& req) {
  v1::HeartbeatResponse resp;
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(req.agent());
  if (it == agents_.end() || req.epoch() != epoch_ || it->second.lost ||
      it->second.incarnation != req.incarnation()) {
    resp.set_reregister(true);
    return resp;
  }
  it->second.last_seen = Clock::now();
  if (req.layout_generation() != it->second.layout->generation()) resp.set_send_layout(true);
  return resp;
}

bool Membership::ReportLayout(const v1::AgentLayout& layout) {
  {
    absl::MutexLock lock(&mu_);
    auto it = agents_.find(layout.agent());
    if (it == agents_.end()) return false;
    if (it->second.layout->generation() == layout.generation() &&
        it->second.layout->tensors_size() == layout.tensors_size()) {
      it->second.last_seen = Clock::now();
      return true;  // nothing new: skip the copy
    }
  }
  return ReportLayout(v1::AgentLayout(layout));
}

bool Membership::ReportLayout(v1::AgentLayout&& moved) {
  auto layout = std::make_shared<v1::AgentLayout>(std::move(moved));
  std::shared_ptr<const v1::AgentLayout> old;  // freed outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = agents_.find(layout->agent());
    if (it == agents_.end()) return false;
    it->second.last_seen = Clock::now();
    if (it->second.layout->generation() == layout->generation() &&
        it->second.layout->tensors_size() == layout->tensors_size()) {
      return true;  // nothing new
    }
    layout->set_agent(it->first);
    old = std::move(it->second.layout);
    it->second.layout = layout;
    ++layout_version_;
  }
  spdlog::info("agent {} reported layout generation {} ({} tensors)", layout->agent(),
               layout->generation(), layout->tensors_size());
  Release(std::move(old));
  return true;
}

std::vector<std::string> Membership::Sweep() {
  std::vector<std::string> lost;
  absl::MutexLock lock(&mu_);
  const auto now = Clock::now();
  for (auto& [name, r] : agents_) {
    if (!r.lost && now - r.last_seen > heartbeat_timeout_) {
      r.lost = true;
      ++layout_version_;
      lost.push_back(name);
      spdlog::warn("agent {} lost: no heartbeat for {} ms", name, heartbeat_timeout_.count());
    }
  }
  return lost;
}

std::vector<AgentRecord> Membership::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<AgentRecord> out;
  for (const auto& [name, r] : agents_) out.push_back(r);
  return out;
}

std::map<std::string, std::string> Membership::Endpoints() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::string> out;
  for (const auto& [name, r] : agents_) out.emplace(name, r.info.control_endpoint());
  return out;
}

int Membership::CountAgents(bool lost) const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [name, r] : agents_) n += r.lost == lost ? 1 : 0;
  return n;
}

int64_t Membership::CountTensors() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [name, r] : agents_) n += r.lost ? 0 : r.layout->tensors_size();
  return n;
}

uint64_t Membership::layout_version() const {
  absl::MutexLock lock(&mu_);
  return layout_version_;
}

std::string Membership::FirstLost(const std::vector<std::string>& names) const {
  absl::MutexLock lock(&mu_);
  for (const auto& n : names) {
    auto it = agents_.find(n);
    if (it == agents_.end() || it->second.lost) return n;
  }
  return "";
}

bool Membership::WaitFor(const std::function<bool()>& ready, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (ready()) return true;
    if (Clock::now() >= deadline) return false;
    absl::MutexLock lock(&mu_);
    const uint64_t seen = layout_version_;
    auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return layout_version_ != seen; };
    mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Milliseconds(100));
  }
}

}  // namespace wb::controller
