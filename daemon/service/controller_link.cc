#include "daemon/service/controller_link.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "common/grpc/message_limits.h"
#include "common/identity/incarnation_digest.h"
#include "common/process/malloc_arenas.h"

namespace wb::service {

namespace v1 = weightbeam::v1;

namespace {
using Clock = std::chrono::steady_clock;

void WithDeadline(grpc::ClientContext* ctx, int ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

// A layout of 10^6 tensors is ~150 MiB on the wire: give big layouts time to travel.
int LayoutDeadlineMs(const v1::AgentLayout& layout) { return 5000 + layout.tensors_size() / 20; }

// A report's layout is built, sent and freed: from 10^4 tensors on, give what it held back to
// the kernel, or the next report (built on another thread) grows the heap again. Not while the
// layout is still changing (`moved`: registrations arrived since the report was built): the
// next report follows within the gap and would fault every page back in, zeroed (at 10^6
// tensors, clearing pages was an eighth of the agents' time); the last report of a burst
// trims.
void ReleaseReport(int tensors, bool moved) {
  if (tensors >= 10000 && !moved) ReturnFreeMemory();
}

std::unique_ptr<v1::Controller::Stub> NewStub(const wb::grpcutil::ChannelFactory& channels,
                                              const std::string& address, const char* purpose) {
  grpc::ChannelArguments args;
  // Reconnect quickly once the controller is back.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxSendMessageSize(kMaxControlMessageBytes);
  // Channels with different arguments do not share a connection: heartbeats never queue
  // behind a large layout.
  args.SetString("wb.purpose", purpose);
  return v1::Controller::NewStub(channels.Create(address, args));
}
}  // namespace

ControllerLink::ControllerLink(std::string address, uint32_t heartbeat_ms,
                               std::function<v1::AgentInfo()> info,
                               std::function<v1::AgentLayout()> layout,
                               std::function<uint64_t()> generation,
                               const wb::grpcutil::ChannelFactory& channels,
                               std::string incarnation)
    : address_(std::move(address)),
      incarnation_(incarnation.empty() ? RandomIncarnation() : std::move(incarnation)),
      heartbeat_ms_(heartbeat_ms),
      info_(std::move(info)),
      layout_(std::move(layout)),
      generation_(std::move(generation)) {
  if (!generation_) generation_ = [this] { return layout_().generation(); };
  stub_ = NewStub(channels, address_, "heartbeat");
  report_stub_ = NewStub(channels, address_, "layout");
}

ControllerLink::~ControllerLink() { Stop(); }

void ControllerLink::Start() {
  thread_ = std::thread([this] { Run(); });
  reporter_ = std::thread([this] { RunReports(); });
}

void ControllerLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (reporter_.joinable()) reporter_.join();
}

void ControllerLink::LayoutChanged() {
  absl::MutexLock lock(&mu_);
  report_due_ = true;
}

std::string ControllerLink::RandomIncarnation() {
  std::random_device rd;  // the kernel's CSPRNG on Linux
  std::string bytes(16, '\0');
  for (size_t i = 0; i < bytes.size(); i += 4) {
    const uint32_t r = rd();
    std::memcpy(&bytes[i], &r, 4);
  }
  return bytes;
}

std::string ControllerLink::incarnation_digest() const {
  return identity::IncarnationDigest(incarnation_);
}

bool ControllerLink::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

bool ControllerLink::Register() {
  const auto t0 = Clock::now();
  grpc::Status s;
  v1::RegisterAgentResponse resp;
  std::string agent_name;
  uint64_t generation = 0;
  int tensors = 0;
  {
    grpc::ClientContext ctx;
    v1::RegisterAgentRequest req;
    *req.mutable_agent() = info_();
    *req.mutable_layout() = layout_();
    req.set_incarnation(incarnation_);
    WithDeadline(&ctx, LayoutDeadlineMs(req.layout()));
    s = stub_->RegisterAgent(&ctx, req, &resp);
    agent_name = req.agent().name();
    generation = req.layout().generation();
    tensors = req.layout().tensors_size();
  }
  ReleaseReport(tensors, generation_() != generation);
  if (!s.ok()) {
    // Retried with backoff (at most every 5 s); a refusal (token, certificate) shows here.
    spdlog::warn("cannot register with controller {}: {}", address_, s.error_message());
    return false;
  }
  absl::MutexLock lock(&mu_);
  ReportDone(t0);
  epoch_ = resp.epoch();
  agent_name_ = agent_name;
  reported_generation_ = generation;
  if (resp.heartbeat_interval_ms() > 0) heartbeat_ms_ = resp.heartbeat_interval_ms();
  spdlog::info("registered with controller {} (epoch {}, {} tensors)", address_, epoch_, tensors);
  return true;
}

void ControllerLink::ReportDone(Clock::time_point started) {
  last_report_ = Clock::now();
  const auto cost = std::chrono::duration_cast<std::chrono::milliseconds>(last_report_ - started);
  report_gap_ = std::max(std::chrono::milliseconds(20), 4 * cost);
  layout_reports_++;
}

ControllerLink::Beat ControllerLink::Heartbeat() {
  const uint64_t generation = generation_();
  v1::HeartbeatRequest req;
  {
    absl::MutexLock lock(&mu_);
    req.set_agent(agent_name_);
    req.set_epoch(epoch_);
  }
  req.set_layout_generation(generation);
  req.set_incarnation(incarnation_);
  bool report_crossing;  // a report in flight while this heartbeat travels
  {
    absl::MutexLock lock(&mu_);
    report_crossing = report_in_flight_;
  }
  const uint64_t reports_before = layout_reports_.load();
  grpc::ClientContext ctx;
  WithDeadline(&ctx, std::max<int>(2000, heartbeat_ms_ * 2));
  v1::HeartbeatResponse resp;
  grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
  if (!s.ok()) {
    spdlog::warn("controller {} unreachable: {}", address_, s.error_message());
    return Beat::kNoAnswer;
  }
  if (resp.reregister()) {
    spdlog::info("controller {} asks to register again (it restarted)", address_);
    return Beat::kRegisterAgain;
  }
  absl::MutexLock lock(&mu_);
  // "Send your layout" means the controller's generation differed from this heartbeat's. A
  // report in flight (or landed) meanwhile may carry exactly that layout: then the report loop
  // compares generations as usual, instead of re-sending 10^6 tensors for nothing.
  report_crossing =
      report_crossing || report_in_flight_ || layout_reports_.load() != reports_before;
  if (resp.send_layout() && !report_crossing) report_forced_ = true;
  if (resp.send_layout() || generation != reported_generation_) report_due_ = true;
  return Beat::kAlive;
}

void ControllerLink::ReportLayout() {
  const auto t0 = Clock::now();
  grpc::Status s;
  int tensors = 0;
  uint64_t generation = 0;
  {
    v1::ReportLayoutRequest req;
    req.set_incarnation(incarnation_);
    *req.mutable_layout() = layout_();
    tensors = req.layout().tensors_size();
    generation = req.layout().generation();
    grpc::ClientContext ctx;
    WithDeadline(&ctx, LayoutDeadlineMs(req.layout()));
    v1::ReportLayoutResponse resp;
    s = report_stub_->ReportLayout(&ctx, req, &resp);
  }
  ReleaseReport(tensors, generation_() != generation);
  absl::MutexLock lock(&mu_);
  if (!s.ok()) {
    spdlog::warn("reporting the layout ({} tensors) to controller {} failed: {}", tensors, address_,
                 s.error_message());
    report_due_ = true;  // the next heartbeat's answer decides again
    last_report_ = Clock::now();
    return;
  }
  reported_generation_ = generation;
  ReportDone(t0);
}

void ControllerLink::RunReports() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    auto wanted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (report_due_ && registered_);
    };
    mu_.Await(absl::Condition(&wanted));
    if (stop_) return;
    // Coalesce: wait out the gap; the report then carries every change made meanwhile.
    auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    const auto next = last_report_ + report_gap_;
    if (Clock::now() < next) {
      mu_.AwaitWithTimeout(absl::Condition(&stopped), absl::FromChrono(next - Clock::now()));
      continue;  // re-check: stopped, or no longer registered
    }
    const bool forced = report_forced_;
    report_due_ = false;
    report_forced_ = false;
    mu_.Unlock();
    const bool changed = forced || generation_() != [this] {
      absl::MutexLock l(&mu_);
      return reported_generation_;
    }();
    if (changed) {
      {
        absl::MutexLock l(&mu_);
        report_in_flight_ = true;
      }
      ReportLayout();
      absl::MutexLock l(&mu_);
      report_in_flight_ = false;
    }
    mu_.Lock();
  }
}

void ControllerLink::Run() {
  int backoff_ms = 100;
  // Heartbeats drift by up to 10 % of the interval each time: agents started together (a node
  // boot, a controller restart that every agent re-registers with) would otherwise beat in step
  // and reach the controller in bursts of hundreds at once, in the middle of someone's step.
  std::minstd_rand jitter(std::random_device{}());
  while (true) {
    bool registered;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      registered = registered_;
    }
    bool ok;
    if (registered) {
      // One heartbeat without an answer (a busy controller, a long step on a loaded node) is
      // not a reason to send the whole layout again (10^6 tensors are ~150 MiB on the wire and
      // a GB of the controller's memory while it parses them): the next heartbeat tells.
      const Beat beat = Heartbeat();
      missed_heartbeats_ = beat == Beat::kNoAnswer ? missed_heartbeats_ + 1 : 0;
      ok = beat == Beat::kAlive || (beat == Beat::kNoAnswer && missed_heartbeats_ < 3);
    } else {
      ok = Register();
      missed_heartbeats_ = 0;
    }
    absl::MutexLock lock(&mu_);
    registered_ = ok;
    int wait_ms;
    if (ok) {
      backoff_ms = 100;
      const int spread = static_cast<int>(heartbeat_ms_ / 10);
      wait_ms = static_cast<int>(heartbeat_ms_) +
                (spread > 0 ? std::uniform_int_distribution<int>(-spread, spread)(jitter) : 0);
    } else {
      wait_ms = backoff_ms;
      backoff_ms = std::min(backoff_ms * 2, 5000);
    }
    auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopped), absl::Milliseconds(wait_ms));
  }
}

}  // namespace wb::service
