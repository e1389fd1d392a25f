#include "controller/controller_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

bool WorldComplete(const std::vector<AgentRecord>& agents, const v1::ExpectedWorld& world,
                   std::string* missing) {
  std::set<int> trainers;
  std::set<std::pair<int, int>> inference;
  std::vector<std::string> lost;
  for (const auto& a : agents) {
    if (a.lost) {
      lost.push_back(a.info.name());
      continue;
    }
    for (const auto& t : a.layout->tensors()) {
      if (t.owner().role() == v1::ROLE_TRAINER) trainers.insert(t.owner().rank());
      if (t.owner().role() == v1::ROLE_INFERENCE) {
        inference.insert({t.owner().replica(), t.owner().rank()});
      }
    }
  }
  std::vector<std::string> gaps;
  if (world.trainer_ranks() == 0 && world.inference_replicas() == 0) {
    if (trainers.empty()) gaps.push_back("no trainer tensors registered");
    if (inference.empty()) gaps.push_back("no inference tensors registered");
  } else {
    for (int r = 0; r < world.trainer_ranks(); ++r) {
      if (!trainers.count(r)) gaps.push_back(absl::StrCat("trainer rank ", r));
    }
    const int ranks = std::max(1, world.inference_ranks_per_replica());
    for (int k = 0; k < world.inference_replicas(); ++k) {
      for (int r = 0; r < ranks; ++r) {
        if (!inference.count({k, r})) {
          gaps.push_back(absl::StrCat("inference replica ", k, " rank ", r));
        }
      }
    }
  }
  if (gaps.size() > 8) {
    size_t more = gaps.size() - 8;
    gaps.resize(8);
    gaps.push_back(absl::StrCat("and ", more, " more"));
  }
  *missing = absl::StrJoin(gaps, ", ");
  // A gap is most often explained by an agent that stopped heartbeating: name it.
  if (!gaps.empty() && !lost.empty()) {
    absl::StrAppend(missing, " (agents lost, no heartbeat: ", absl::StrJoin(lost, ", "), ")");
  }
  return gaps.empty();
}

ControllerCore::ControllerCore(config::ControllerConfig config, uint64_t epoch,
                               PlanFunction planner)
    : config_(std::move(config)),
      membership_(epoch, std::chrono::milliseconds(config_.heartbeat_timeout_ms)),
      planner_(std::move(planner)) {}

void ControllerCore::Sweep() { membership_.Sweep(); }

std::string ControllerCore::Endpoint(const std::map<std::string, std::string>& endpoints,
                                     const std::string& agent) {
  auto it = endpoints.find(agent);
  return it == endpoints.end() ? "" : it->second;
}

absl::StatusOr<v1::ExpectedWorld> ControllerCore::RequestedWorld(const v1::PlanRequest& req) const {
  v1::ExpectedWorld world = req.world();
  if (world.trainer_ranks() == 0 && world.inference_replicas() == 0) {
    world.set_trainer_ranks(config_.world.trainer_ranks);
    world.set_inference_replicas(config_.world.inference_replicas);
    world.set_inference_ranks_per_replica(config_.world.inference_ranks_per_replica);
  }
  // Every rank is an agent's registration: a world beyond this cannot be waited for, and
  // checking it would cost the controller time and memory for nothing.
  constexpr uint64_t kMaxRanks = 1 << 20;
  if (world.trainer_ranks() < 0 || world.inference_replicas() < 0 ||
      world.inference_ranks_per_replica() < 0) {
    return absl::InvalidArgumentError("world sizes must not be negative");
  }
  const uint64_t trainers = static_cast<uint64_t>(world.trainer_ranks());
  const uint64_t inference = static_cast<uint64_t>(world.inference_replicas()) *
                             static_cast<uint64_t>(world.inference_ranks_per_replica());
  if (trainers > kMaxRanks || inference > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("world of ", trainers, " trainer rank(s) and ", world.inference_replicas(),
                     " x ", world.inference_ranks_per_replica(),
                     " inference rank(s) is beyond the limit of ", kMaxRanks, " ranks per side"));
  }
  return world;
}

std::chrono::milliseconds ControllerCore::PlanWait(const v1::PlanRequest& req) const {
  // plan_wait_ms is a cap: a caller cannot hold the controller's attention longer.
  return std::chrono::milliseconds(req.wait_ms() ? std::min(req.wait_ms(), config_.plan_wait_ms)
                                                 : config_.plan_wait_ms);
}

bool ControllerCore::WorldReady(const v1::ExpectedWorld& world, std::string* missing) {
  return WorldComplete(membership_.Snapshot(), world, missing);
}

absl::StatusOr<v1::PlanSummary> ControllerCore::PlanNow(const v1::PlanRequest& req,
                                                        const v1::ExpectedWorld& world) {
  absl::MutexLock lock(&plan_mu_);
  delta_choice_ = req.delta();
  return PlanLocked(world, std::chrono::milliseconds(0));
}

absl::StatusOr<v1::PlanSummary> ControllerCore::Plan(const v1::PlanRequest& req,
                                                     const std::function<bool()>& cancelled) {
  auto world = RequestedWorld(req);
  if (!world.ok()) return world.status();
  const auto wait = PlanWait(req);
  std::string missing;
  // No lock while waiting: steps of the current plan go on meanwhile.
  const bool complete = membership_.WaitFor(
      [&] { return (cancelled && cancelled()) || WorldReady(*world, &missing); }, wait);
  if (cancelled && cancelled()) return absl::CancelledError("the Plan caller went away");
  if (!complete) {
    return absl::DeadlineExceededError(absl::StrCat("the world is incomplete after waiting ",
                                                    wait.count(), " ms; missing: ", missing));
  }
  return PlanNow(req, *world);
}

absl::StatusOr<v1::PlanSummary> ControllerCore::PlanLocked(const v1::ExpectedWorld& world,
                                                           std::chrono::milliseconds wait) {
  std::string missing;
  // Callers wait without the lock; with it held, only a look (wait 0), so steps never queue
  // behind a wait.
  bool complete = membership_.WaitFor(
      [&] { return WorldComplete(membership_.Snapshot(), world, &missing); }, wait);
  if (!complete) {
    return absl::DeadlineExceededError(absl::StrCat("the world is incomplete after waiting ",
                                                    wait.count(), " ms; missing: ", missing));
  }
  // Layouts are pushed by heartbeats; pull them now so the plan sees every registration.
  if (auto s = RefreshLayouts(); !s.ok()) return s;
  const uint64_t layout_version = membership_.layout_version();
  std::vector<AgentRecord> agents;
  for (auto& a : membership_.Snapshot()) {
    if (!a.lost) agents.push_back(std::move(a));
  }
  // An agent lost while the layouts were pulled would silently drop its tensors from the plan
  // (an empty plan "commits" nothing): check the world again on what the planner will see.
  if (!WorldComplete(agents, world, &missing)) {
    return absl::UnavailableError(
        absl::StrCat("the world changed while planning; missing: ", missing));
  }
  const uint64_t plan_id = next_plan_id_++;
  auto built = planner_(agents, config_, plan_id);
  if (!built.ok()) return built.status();

  std::set<std::string> receivers;
  const auto endpoints = membership_.Endpoints();
  const bool delta = delta_choice_ == v1::DELTA_CHOICE_ON ||
                     (delta_choice_ == v1::DELTA_CHOICE_CONFIG && config_.delta.enabled);
  if (delta) {
    if (auto s = LoadDeltaReceivers(&*built, endpoints); !s.ok()) {
      has_plan_ = false;
      return s;
    }
  }
  for (const auto& [agent, plan] : built->agent_plans) {
    for (const auto& op : plan.ops()) receivers.insert(op.dst_agent());
  }
  // Receivers accept handshakes only from the senders introduced here, so this goes first.
  if (auto s = IntroduceSenders(*built, agents, plan_id, endpoints); !s.ok()) {
    has_plan_ = false;
    return s;
  }
  if (std::string failed = FailedCalls(LoadPlans(built->agent_plans, endpoints)); !failed.empty()) {
    has_plan_ = false;
    return absl::UnavailableError(absl::StrCat("loading the plan failed: ", failed));
  }
  plan_ = std::move(*built);
  has_plan_ = true;
  delta_need_anchor_ = true;
  delta_since_anchor_ = 0;
  plan_layout_version_ = layout_version;
  senders_.clear();
  for (const auto& [agent, plan] : plan_.agent_plans) senders_.push_back(agent);
  receivers_.assign(receivers.begin(), receivers.end());
  {
    absl::MutexLock slock(&state_mu_);
    summary_ = plan_.summary;
    summary_valid_ = true;
    summary_layout_version_ = layout_version;
  }
  spdlog::info("plan {} ({}): {} ops, {} bytes, {} sender(s), {} receiver(s), predicted {:.3f} s",
               plan_.summary.plan_id(), plan_.summary.plan_hash(), plan_.summary.total_ops(),
               plan_.summary.total_bytes(), senders_.size(), receivers_.size(),
               plan_.summary.predicted_step_seconds());
  return plan_.summary;
}

absl::Status ControllerCore::IntroduceSenders(const BuiltPlan& built,
                                              const std::vector<AgentRecord>& agents,
                                              uint64_t plan_id,
                                              const std::map<std::string, std::string>& endpoints) {
  std::map<std::string, std::set<std::string>> senders_of;  // receiver -> senders
  for (const auto& [agent, plan] : built.agent_plans) {
    for (const auto& op : plan.ops()) senders_of[op.dst_agent()].insert(agent);
  }
  // Every agent hears it, so one that stopped receiving drops its old senders.
  std::vector<CallTarget<v1::IntroduceRequest>> targets;
  for (const auto& a : agents) {
    CallTarget<v1::IntroduceRequest> t{a.info.name(), Endpoint(endpoints, a.info.name()), {}};
    if (t.endpoint.empty()) continue;
    t.request.set_plan_id(plan_id);
    for (const auto& s : senders_of[a.info.name()]) t.request.add_senders(s);
    targets.push_back(std::move(t));
  }
  const std::string failed = FailedCalls(CallAll<v1::IntroduceRequest, v1::IntroduceResponse>(
      &channels_, targets, std::chrono::milliseconds(10000),
      [](auto* s, auto* c, auto* q, auto* r, auto d) { s->async()->Introduce(c, q, r, d); }));
  if (failed.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("introducing senders to receivers failed: ", failed));
}

std::vector<CallResult<v1::LoadPlanResponse>> ControllerCore::LoadPlans(
    std::map<std::string, v1::AgentPlan> plans,
    const std::map<std::string, std::string>& endpoints) {
  std::vector<CallTarget<v1::LoadPlanRequest>> targets;
  for (auto& [agent, plan] : plans) {
    CallTarget<v1::LoadPlanRequest> t{agent, Endpoint(endpoints, agent), {}};
    *t.request.mutable_plan() = std::move(plan);
    targets.push_back(std::move(t));
  }
  return CallAll<v1::LoadPlanRequest, v1::LoadPlanResponse>(
      &channels_, targets, std::chrono::milliseconds(30000),
      [](auto* s, auto* c, auto* q, auto* r, auto d) { s->async()->LoadPlan(c, q, r, d); });
}

absl::Status ControllerCore::LoadDeltaReceivers(
    BuiltPlan* built, const std::map<std::string, std::string>& endpoints) {
  v1::DeltaSettings settings;
  settings.set_enabled(true);
  settings.set_anchor_every(config_.delta.anchor_every);
  settings.set_receive_fraction(config_.delta.receive_fraction);
  settings.set_verify(config_.delta.verify);
  *built->summary.mutable_delta() = settings;
  std::map<std::string, v1::AgentPlan> halves;  // by receiving agent
  for (auto& [sender, plan] : built->agent_plans) {
    *plan.mutable_delta() = settings;
    for (const auto& op : plan.ops()) {
      v1::AgentPlan& half = halves[op.dst_agent()];
      v1::IncomingOp* in = half.add_incoming();
      in->set_src_agent(sender);
      *in->mutable_op() = op;
    }
  }
  for (auto& [receiver, half] : halves) {
    half.set_agent(receiver);
    half.set_plan_id(built->summary.plan_id());
    half.set_delta_receive(true);
    *half.mutable_delta() = settings;
  }
  const auto results = LoadPlans(std::move(halves), endpoints);
  for (const auto& r : results) {
    if (!r.status.ok()) continue;
    for (const auto& slot : r.response.delta_slots()) {
      auto it = built->agent_plans.find(slot.src_agent());
      if (it != built->agent_plans.end()) *it->second.add_delta_slots() = slot;
    }
    for (auto& [sender, plan] : built->agent_plans) {
      for (auto& peer : *plan.mutable_peers()) {
        if (peer.agent() == r.agent) *peer.add_regions() = r.response.delta_region();
      }
    }
  }
  if (std::string failed = FailedCalls(results); !failed.empty()) {
    return absl::UnavailableError(
        absl::StrCat("loading the delta receive regions failed: ", failed));
  }
  return absl::OkStatus();
}

absl::Status ControllerCore::RefreshLayouts() {
  std::vector<CallTarget<v1::DescribeRequest>> targets;
  for (const auto& a : membership_.Snapshot()) {
    if (a.lost) continue;
    CallTarget<v1::DescribeRequest> t{a.info.name(), a.info.control_endpoint(), {}};
    // An agent whose layout we already hold answers with its generation only.
    t.request.set_known_generation(a.layout->generation());
    targets.push_back(std::move(t));
  }
  auto results = CallAll<v1::DescribeRequest, v1::DescribeResponse>(
      &channels_, targets, std::chrono::milliseconds(60000),
      [](auto* s, auto* c, auto* q, auto* r, auto d) { s->async()->Describe(c, q, r, d); });
  for (auto& r : results) {
    if (!r.status.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "agent ", r.agent, " did not describe its layout: ", r.status.error_message()));
    }
    if (r.response.layout_unchanged()) continue;
    v1::AgentLayout* layout = r.response.mutable_layout();
    layout->set_agent(r.agent);
    if (auto s = CheckLayout(r.agent, *layout); !s.ok()) return s;
    membership_.ReportLayout(std::move(*layout));
  }
  return absl::OkStatus();
}

void ControllerCore::Record(const v1::StepResult& r) {
  {
    absl::MutexLock lock(&state_mu_);
    if (r.ok()) last_committed_ = std::max(last_committed_, r.version());
    recent_.push_back(r);
    while (recent_.size() > 16) recent_.pop_front();
  }
  steps_.Publish(r);
}

absl::Status ControllerCore::ReadyForStep(uint64_t version) {
  uint64_t last_committed;
  {
    absl::MutexLock slock(&state_mu_);
    last_committed = last_committed_;
  }
  if (version <= last_committed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " is not newer than the last committed ", "version ", last_committed));
  }
  membership_.Sweep();
  if (!has_plan_ || membership_.layout_version() != plan_layout_version_) {
    spdlog::info("step {}: {}; planning", version,
                 has_plan_ ? "the layout changed since the plan" : "no plan yet");
    v1::ExpectedWorld world;
    world.set_trainer_ranks(config_.world.trainer_ranks);
    world.set_inference_replicas(config_.world.inference_replicas);
    world.set_inference_ranks_per_replica(config_.world.inference_ranks_per_replica);
    auto planned = PlanLocked(world, std::chrono::milliseconds(0));
    if (!planned.ok()) {
      return absl::Status(planned.status().code(),
                          absl::StrCat("cannot plan: ", planned.status().message()));
    }
  }
  std::vector<std::string> involved = senders_;
  involved.insert(involved.end(), receivers_.begin(), receivers_.end());
  if (std::string lost = membership_.FirstLost(involved); !lost.empty()) {
    return absl::UnavailableError(absl::StrCat("agent ", lost, " is lost (no heartbeat)"));
  }
  return absl::OkStatus();
}

StepSpec ControllerCore::NextStep(uint64_t version, Clock::time_point started,
                                  std::chrono::milliseconds timeout) {
  StepSpec spec;
  spec.version = version;
  spec.plan_id = plan_.summary.plan_id();
  spec.senders = senders_;
  spec.receivers = receivers_;
  spec.started = started;
  spec.timeout = timeout;
  // Delta mode: anchors (dense, shadows refreshed) after a new plan or a failed step and every
  // anchor_every steps; a random nonce marks this attempt's receive slots.
  spec.delta = plan_.summary.delta().enabled();
  spec.anchor = spec.delta && (delta_need_anchor_ ||
                               delta_since_anchor_ + 1 >=
                                   std::max<uint32_t>(1, plan_.summary.delta().anchor_every()));
  if (spec.delta) {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    while (spec.nonce == 0) spec.nonce = rng();
  }
  return spec;
}

v1::StepResult ControllerCore::Step(uint64_t version, std::chrono::milliseconds timeout) {
  v1::StepResult result;
  result.set_version(version);
  result.set_started_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count());
  const auto t0 = Clock::now();
  auto fail = [&](const std::string& error) {
    delta_need_anchor_ = true;  // the destinations may hold part of this step
    result.set_ok(false);
    result.set_error(error);
    result.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
    spdlog::warn("step {} failed: {}", version, error);
    Record(result);
    return result;
  };
  if (!plan_mu_.TryLock()) {
    return fail("another step or plan is in progress; steps run one at a time");
  }
  struct Unlock {
    absl::Mutex* mu;
    ~Unlock() { mu->Unlock(); }
  } unlock{&plan_mu_};
  if (auto s = ReadyForStep(version); !s.ok()) return fail(std::string(s.message()));
  const StepSpec spec = NextStep(version, t0, timeout);
  if (auto s = protocol_.Run(spec, &result); !s.ok()) return fail(std::string(s.message()));
  if (spec.delta) {
    delta_since_anchor_ = spec.anchor ? 0 : delta_since_anchor_ + 1;
    delta_need_anchor_ = false;
  }
  result.set_ok(true);
  result.set_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
  spdlog::info("step {} committed: {} bytes ({} dense{}) in {:.3f} s", version, result.bytes(),
               result.bytes_dense(),
               !spec.delta   ? ""
               : spec.anchor ? ", delta anchor"
                             : ", delta",
               result.seconds());
  Record(result);
  return result;
}

void ControllerCore::AbortInFlight(const std::string& reason) { protocol_.AbortInFlight(reason); }

v1::PlanSummary ControllerCore::CurrentPlan() const {
  absl::MutexLock lock(&state_mu_);
  return summary_valid_ ? summary_ : v1::PlanSummary();
}

v1::StatusResponse ControllerCore::Status() const {
  v1::StatusResponse s;
  s.set_version("0.1.0");
  s.set_epoch(membership_.epoch());
  const auto now = Clock::now();
  for (const auto& a : membership_.Snapshot()) {
    auto* st = s.add_agents();
    *st->mutable_info() = a.info;
    st->set_state(a.lost ? "lost" : "alive");
    st->set_last_heartbeat_ms_ago(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - a.last_seen).count());
    st->set_tensors(a.layout->tensors_size());
    st->set_layout_generation(a.layout->generation());
  }
  absl::MutexLock lock(&state_mu_);
  if (summary_valid_) *s.mutable_plan() = summary_;
  s.set_layout_changed(!summary_valid_ || membership_.layout_version() != summary_layout_version_);
  s.set_last_committed_version(last_committed_);
  for (const auto& r : recent_) *s.add_recent_steps() = r;
  return s;
}

}  // namespace wb::controller
