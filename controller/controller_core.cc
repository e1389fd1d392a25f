#include "controller/controller_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/process/malloc_arenas.h"
#include "common/version/version.h"

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
    const v1::Owner* last = nullptr;
    for (const auto& t : a.layout->tensors()) {
      if (last && SameOwner(*last, t.owner())) continue;  // 10^6 tensors, a few owners
      last = &t.owner();
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
      planner_(std::move(planner)) {
  world_.set_trainer_ranks(config_.world.trainer_ranks);
  world_.set_inference_replicas(config_.world.inference_replicas);
  world_.set_inference_ranks_per_replica(config_.world.inference_ranks_per_replica);
}

namespace {
// What is left until `deadline`, capped at `cap` and at least 1 ms: calls a step makes while
// planning never outlive the step.
std::chrono::milliseconds Until(Clock::time_point deadline, std::chrono::milliseconds cap) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::clamp(left, std::chrono::milliseconds(1), cap);
}
}  // namespace

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
  relay_choice_ = req.relays();
  checks_ = req.checks();
  frozen_.assign(req.frozen().begin(), req.frozen().end());
  world_ = world;
  {
    absl::MutexLock slock(&state_mu_);
    ledger_has_plan_ = true;
    ledger_plan_request_ = req;
    *ledger_plan_request_.mutable_world() = world;
  }
  // The caller waited for the world without the lock: only a look here. After it: Describe
  // (60 s), Introduce (10 s), LoadPlan (30 s) at most.
  return PlanLocked(world, std::chrono::milliseconds(0), Clock::now() + std::chrono::seconds(100),
                    /*elastic=*/false);
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

absl::StatusOr<std::vector<AgentRecord>> ControllerCore::PlanInput(
    const v1::ExpectedWorld& world, const std::set<std::string>& silent, bool elastic,
    std::map<int, std::string>* left_out, std::map<int, ReplicaView>* replicas) {
  std::vector<AgentRecord> agents;
  for (auto& a : membership_.Snapshot()) {
    // An agent that did not describe its layout is planned as if lost.
    if (silent.count(a.info.name())) a.lost = true;
    agents.push_back(std::move(a));
  }
  const int ranks = world.inference_ranks_per_replica();
  *replicas = CensusReplicas(agents, ranks);
  std::vector<AgentRecord> alive;
  for (auto& a : agents) {
    if (!a.lost) alive.push_back(std::move(a));
  }
  std::string missing;
  if (!elastic) {
    // An agent lost while the layouts were pulled would silently drop its tensors from the plan
    // (an empty plan "commits" nothing): check the world again on what the planner will see.
    if (!WorldComplete(alive, world, &missing)) {
      return absl::UnavailableError(
          absl::StrCat("the world changed while planning; missing: ", missing));
    }
    return alive;
  }
  // Trainers: all of them (a missing source fails the step). Inference: the complete replicas.
  v1::ExpectedWorld trainers_only;
  trainers_only.set_trainer_ranks(world.trainer_ranks());
  if (world.trainer_ranks() > 0 && !WorldComplete(alive, trainers_only, &missing)) {
    // Name the agents that explain the gap: lost, or (a restart's first moments) registered
    // but not answering Describe.
    std::vector<std::string> lost, unanswered;
    for (const auto& a : agents) {
      if (silent.count(a.info.name())) {
        unanswered.push_back(a.info.name());
      } else if (a.lost) {
        lost.push_back(a.info.name());
      }
    }
    if (!lost.empty()) {
      absl::StrAppend(&missing, " (agents lost, no heartbeat: ", absl::StrJoin(lost, ", "), ")");
    }
    if (!unanswered.empty()) {
      absl::StrAppend(&missing, " (agents that did not describe their layout: ",
                      absl::StrJoin(unanswered, ", "), ")");
    }
    return absl::UnavailableError(absl::StrCat("missing: ", missing));
  }
  MarkRegistering(replicas);
  std::set<int> drop;
  size_t complete = 0;
  for (const auto& [k, view] : *replicas) {
    if (view.complete) {
      ++complete;
      continue;
    }
    drop.insert(k);
    (*left_out)[k] = DescribeIncomplete(k, view, ranks);
  }
  // Replicas the world expects that never registered a tensor.
  for (int k = 0; k < world.inference_replicas(); ++k) {
    if (!replicas->count(k)) (*left_out)[k] = absl::StrCat("replica ", k, " (not registered)");
  }
  if (complete < std::max<uint32_t>(1, config_.min_replicas)) {
    std::vector<std::string> why;
    for (const auto& [k, reason] : *left_out) why.push_back(reason);
    return absl::UnavailableError(
        absl::StrCat("below min_replicas (", config_.min_replicas, "): ", complete,
                     " inference replica(s) complete",
                     why.empty() ? "" : "; skipped: ", absl::StrJoin(why, "; ")));
  }
  return WithoutReplicas(std::move(alive), drop);
}

absl::StatusOr<v1::PlanSummary> ControllerCore::PlanLocked(const v1::ExpectedWorld& world,
                                                           std::chrono::milliseconds wait,
                                                           Clock::time_point deadline,
                                                           bool elastic) {
  std::string missing;
  if (!elastic) {
    bool complete = membership_.WaitFor(
        [&] { return WorldComplete(membership_.Snapshot(), world, &missing); }, wait);
    if (!complete) {
      return absl::DeadlineExceededError(absl::StrCat("the world is incomplete after waiting ",
                                                      wait.count(), " ms; missing: ", missing));
    }
  }
  // Layouts are pushed by heartbeats; pull them now so the plan sees every registration.
  const std::set<std::string> silent = RefreshLayouts(deadline);
  if (!silent.empty() && !elastic) {
    return absl::UnavailableError(absl::StrCat("agent ", *silent.begin(),
                                               " did not describe its layout before the deadline"));
  }
  const uint64_t layout_version = membership_.layout_version();
  std::map<int, std::string> left_out;
  std::map<int, ReplicaView> census;
  auto input = PlanInput(world, silent, elastic, &left_out, &census);
  if (!input.ok()) return input.status();
  std::vector<AgentRecord> agents = std::move(*input);
  const uint64_t plan_id = next_plan_id_++;
  const auto planning = Clock::now();
  // The links as measured so far (none measured slow: the config's cost model as it is).
  config::ControllerConfig plan_config = config_;
  plan_config.cost_model.agent_rate_scale = link_learner_.Scales();
  if (relay_choice_ != v1::RELAY_CHOICE_CONFIG) {
    plan_config.relays.enabled = relay_choice_ == v1::RELAY_CHOICE_ON;
  }
  // Senders hold fallback ops to feed a dropped relay's children themselves (not in delta
  // mode: those would need shadows and receive slots for every replica).
  plan_config.relays.direct_fallback =
      !(delta_choice_ == v1::DELTA_CHOICE_ON ||
        (delta_choice_ == v1::DELTA_CHOICE_CONFIG && config_.delta.enabled));
  auto built = planner_(agents, plan_config, plan_id);
  if (!built.ok()) return built.status();
  *built->summary.mutable_checks() = checks_;
  const double planner_seconds = std::chrono::duration<double>(Clock::now() - planning).count();
  const auto loading = Clock::now();

  std::set<std::string> receivers;
  const auto endpoints = membership_.Endpoints();
  const bool delta = delta_choice_ == v1::DELTA_CHOICE_ON ||
                     (delta_choice_ == v1::DELTA_CHOICE_CONFIG && config_.delta.enabled);
  if (!frozen_.empty() && (plan_config.relays.enabled || delta)) {
    return absl::FailedPreconditionError(
        "frozen tensors need a dense plan without relays (delta mode already sends nothing of "
        "an unchanged tensor)");
  }
  if (delta) {
    if (auto s = LoadDeltaReceivers(&*built, endpoints, deadline); !s.ok()) {
      has_plan_ = false;
      return s;
    }
  }
  for (const auto& [agent, plan] : built->agent_plans) {
    // A plan's peers are exactly the agents its ops write to (PlanToProto): no walk over 10^6
    // ops with a string set.
    for (const auto& peer : plan.peers()) receivers.insert(peer.agent());
  }
  // Receivers accept handshakes only from the senders introduced here, so this goes first.
  if (auto s = IntroduceSenders(*built, agents, plan_id, endpoints, deadline); !s.ok()) {
    has_plan_ = false;
    return s;
  }
  const auto loaded = LoadPlans(&built->agent_plans, endpoints, deadline);
  if (std::string failed = FailedCalls(loaded); !failed.empty()) {
    has_plan_ = false;
    return absl::UnavailableError(absl::StrCat("loading the plan failed: ", failed));
  }
  // A capture plan when every sender of its own bytes can capture them (the fewest slots).
  built->capture_slots = 0;
  bool first = true;
  for (const auto& r : loaded) {
    if (built->relay_only.count(r.agent)) continue;
    const uint32_t slots = r.response.capture_slots();
    built->capture_slots = first ? slots : std::min(built->capture_slots, slots);
    first = false;
  }
  if (built->capture_slots > 0) {
    spdlog::info("plan {}: steps capture first ({} capture slot(s) on every sender)", plan_id,
                 built->capture_slots);
  }
  // The senders hold their ops now: keep who they are, not 10^6 ops (or the regions' keys).
  for (auto& [agent, plan] : built->agent_plans) {
    v1::AgentPlan names_only;  // a fresh message: Clear() would keep the ops allocated
    names_only.set_agent(plan.agent());
    names_only.set_plan_id(plan.plan_id());
    plan = std::move(names_only);
  }
  plan_ = std::move(*built);
  ReturnFreeMemory();  // the old plan, and what building and sending this one held
  has_plan_ = true;
  frozen_sent_ = false;  // the first step of a plan sends the frozen tensors too
  delta_need_anchor_ = true;
  delta_since_anchor_ = 0;
  plan_layout_version_ = layout_version;
  plan_partial_ = !silent.empty();
  senders_.clear();
  for (const auto& [agent, plan] : plan_.agent_plans) senders_.push_back(agent);
  receivers_.assign(receivers.begin(), receivers.end());
  plan_replicas_.clear();
  plan_left_out_ = std::move(left_out);
  for (const auto& [k, view] : census) {
    if (view.complete && !plan_left_out_.count(k)) {
      plan_replicas_[k].assign(view.agents.begin(), view.agents.end());
    }
  }
  {
    absl::MutexLock slock(&state_mu_);
    summary_ = plan_.summary;
    summary_valid_ = true;
    summary_layout_version_ = layout_version;
    for (const auto& [k, view] : census) ledger_.Saw(k);
    ledger_plan_agents_ = senders_;
    for (const auto& r : receivers_) {
      if (!plan_.agent_plans.count(r)) ledger_plan_agents_.push_back(r);
    }
  }
  spdlog::info(
      "plan {} ({}): {} ops, {} bytes, {} sender(s), {} receiver(s), {} inference replica(s){}, "
      "predicted {:.3f} s; planner {:.3f} s, loading {:.3f} s",
      plan_.summary.plan_id(), plan_.summary.plan_hash(), plan_.summary.total_ops(),
      plan_.summary.total_bytes(), senders_.size(), receivers_.size(), plan_replicas_.size(),
      plan_left_out_.empty() ? "" : absl::StrCat(" (", plan_left_out_.size(), " left out)"),
      plan_.summary.predicted_step_seconds(), planner_seconds,
      std::chrono::duration<double>(Clock::now() - loading).count());
  return plan_.summary;
}

absl::Status ControllerCore::IntroduceSenders(const BuiltPlan& built,
                                              const std::vector<AgentRecord>& agents,
                                              uint64_t plan_id,
                                              const std::map<std::string, std::string>& endpoints,
                                              Clock::time_point deadline) {
  std::map<std::string, std::set<std::string>> senders_of;  // receiver -> senders
  for (const auto& [agent, plan] : built.agent_plans) {
    for (const auto& peer : plan.peers()) senders_of[peer.agent()].insert(agent);
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
      &channels_, targets, Until(deadline, std::chrono::milliseconds(10000)),
      [](auto* s, auto* c, const auto& q, auto* cq) {
        return s->PrepareAsyncIntroduce(c, q, cq);
      }));
  if (failed.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("introducing senders to receivers failed: ", failed));
}

std::vector<CallResult<v1::LoadPlanResponse>> ControllerCore::LoadPlans(
    std::map<std::string, v1::AgentPlan>* plans,
    const std::map<std::string, std::string>& endpoints, Clock::time_point deadline) {
  std::vector<CallTarget<v1::LoadPlanRequest>> targets;
  targets.reserve(plans->size());
  for (auto& [agent, plan] : *plans) {
    CallTarget<v1::LoadPlanRequest> t{agent, Endpoint(endpoints, agent), {}};
    t.request.mutable_plan()->Swap(&plan);
    targets.push_back(std::move(t));
  }
  auto results = CallAll<v1::LoadPlanRequest, v1::LoadPlanResponse>(
      &channels_, targets, Until(deadline, std::chrono::milliseconds(30000)),
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncLoadPlan(c, q, cq); });
  for (auto& t : targets) (*plans)[t.agent].Swap(t.request.mutable_plan());
  return results;
}

absl::Status ControllerCore::LoadDeltaReceivers(BuiltPlan* built,
                                                const std::map<std::string, std::string>& endpoints,
                                                Clock::time_point deadline) {
  v1::DeltaSettings settings;
  settings.set_enabled(true);
  settings.set_anchor_every(config_.delta.anchor_every);
  settings.set_receive_fraction(config_.delta.receive_fraction);
  settings.set_verify(config_.delta.verify);
  *built->summary.mutable_delta() = settings;
  std::map<std::string, v1::AgentPlan> halves;  // by receiving agent
  for (auto& [sender, plan] : built->agent_plans) {
    // Relay ops forward the applied bytes, dense (StepProtocol::ForwardAppliedDeltas): no
    // shadows or receive slots for them.
    bool own_ops = false;
    for (const auto& op : plan.ops()) own_ops = own_ops || !op.relay();
    if (!own_ops) continue;
    *plan.mutable_delta() = settings;
    for (const auto& op : plan.ops()) {
      if (op.relay()) continue;
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
  const auto results = LoadPlans(&halves, endpoints, deadline);
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

std::set<std::string> ControllerCore::RefreshLayouts(Clock::time_point deadline) {
  std::vector<CallTarget<v1::DescribeRequest>> targets;
  for (const auto& a : membership_.Snapshot()) {
    if (a.lost) continue;
    CallTarget<v1::DescribeRequest> t{a.info.name(), a.info.control_endpoint(), {}};
    // An agent whose layout we already hold answers with its generation only.
    t.request.set_known_generation(a.layout->generation());
    targets.push_back(std::move(t));
  }
  auto results = CallAll<v1::DescribeRequest, v1::DescribeResponse>(
      &channels_, targets, Until(deadline, std::chrono::milliseconds(60000)),
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncDescribe(c, q, cq); });
  std::set<std::string> silent;
  for (auto& r : results) {
    if (!r.status.ok()) {
      spdlog::warn("agent {} did not describe its layout: {}", r.agent, r.status.error_message());
      silent.insert(r.agent);
      continue;
    }
    if (r.response.layout_unchanged()) continue;
    v1::AgentLayout* layout = r.response.mutable_layout();
    layout->set_agent(r.agent);
    if (auto s = CheckLayout(r.agent, *layout); !s.ok()) {
      // A layout the controller refuses is not taken: plan as if the agent were silent.
      spdlog::warn("agent {} described a layout that is refused: {}", r.agent,
                   std::string(s.message()));
      silent.insert(r.agent);
      continue;
    }
    membership_.ReportLayout(std::move(*layout));
  }
  return silent;
}

void ControllerCore::Record(const v1::StepResult& r) {
  {
    absl::MutexLock lock(&state_mu_);
    if (r.ok()) last_committed_ = std::max(last_committed_, r.version());
    if (!r.rollback() && r.version() == step_in_progress_) step_in_progress_ = 0;
    recent_.push_back(r);
    while (recent_.size() > 16) recent_.pop_front();
  }
  PublishLedger();
  steps_.Publish(r);
}

absl::Status ControllerCore::ReplanIfChanged(uint64_t version, Clock::time_point deadline) {
  membership_.Sweep();
  if (has_plan_ && !plan_partial_ && membership_.layout_version() == plan_layout_version_) {
    return absl::OkStatus();
  }
  spdlog::info("step {}: {}; planning", version,
               !has_plan_      ? "no plan yet"
               : plan_partial_ ? "the last plan left out an agent that did not answer"
                               : "the layout or membership changed since the plan");
  // Planning may take half of what is left of the step: the step itself needs the rest.
  const auto plan_deadline = Clock::now() + (deadline - Clock::now()) / 2;
  auto planned = PlanLocked(world_, std::chrono::milliseconds(0), plan_deadline, /*elastic=*/true);
  if (!planned.ok()) {
    return absl::Status(planned.status().code(),
                        absl::StrCat("cannot plan: ", planned.status().message()));
  }
  return absl::OkStatus();
}

std::string ControllerCore::TooStale(uint32_t bound) {
  absl::MutexLock slock(&state_mu_);
  std::vector<std::string> behind;
  for (int k : ledger_.Known()) {
    if (plan_replicas_.count(k)) continue;  // gets this step
    const uint64_t after = ledger_.Staleness(k) + 1;
    if (after <= bound) continue;
    auto it = plan_left_out_.find(k);
    behind.push_back(
        absl::StrCat("replica ", k, " would be ", after, " version(s) behind",
                     it == plan_left_out_.end() ? "" : absl::StrCat(": ", it->second)));
  }
  return absl::StrJoin(behind, "; ");
}

absl::Status ControllerCore::ReadyForStep(uint64_t version, Clock::time_point deadline,
                                          std::optional<uint32_t> max_staleness) {
  uint64_t last_committed;
  {
    absl::MutexLock slock(&state_mu_);
    last_committed = last_committed_;
  }
  if (version <= last_committed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " is not newer than the last committed ", "version ", last_committed));
  }
  if (auto s = ReplanIfChanged(version, deadline); !s.ok()) return s;
  // Async RL: block (within the step's deadline) while a replica left out would fall too far
  // behind; a membership change (it returns) replans and checks again.
  while (max_staleness) {
    const std::string behind = TooStale(*max_staleness);
    if (behind.empty()) break;
    // Wait for a layout newer than the one the plan was built from, not the one current now: a
    // registration that lands while planning would otherwise be slept through.
    const uint64_t seen = plan_layout_version_;
    const auto left = Until(deadline, std::chrono::milliseconds(3600000));
    if (Clock::now() >= deadline ||
        !membership_.WaitFor([&] { return membership_.layout_version() != seen; }, left)) {
      return absl::DeadlineExceededError(
          absl::StrCat("max_staleness ", *max_staleness, " would be exceeded: ", behind,
                       "; waited until the step deadline for it to return"));
    }
    if (auto s = ReplanIfChanged(version, deadline); !s.ok()) return s;
  }
  // A lost relay is a lost receiver (dropped with its subtree in the step), not a lost sender.
  std::vector<std::string> own_senders;
  for (const auto& s : senders_) {
    if (!plan_.relay_only.count(s)) own_senders.push_back(s);
  }
  if (std::string lost = membership_.FirstLost(own_senders); !lost.empty()) {
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
  spec.relay_children = plan_.relay_children;
  spec.relay_only = plan_.relay_only;
  spec.predicted_seconds = plan_.summary.predicted_step_seconds();
  spec.receivers = receivers_;
  {
    // Staged receivers may wait for their watchers before answering a commit.
    const std::set<std::string> receiving(receivers_.begin(), receivers_.end());
    uint32_t wait_ms = 0;
    for (const AgentRecord& a : membership_.Snapshot()) {
      if (receiving.count(a.info.name())) wait_ms = std::max(wait_ms, a.info.commit_wait_ms());
    }
    spec.commit_wait = std::chrono::milliseconds(wait_ms);
  }
  spec.started = started;
  spec.timeout = timeout;
  // Delta mode: anchors (dense, shadows refreshed) after a new plan or a failed step and every
  // anchor_every steps; a random nonce marks this attempt's receive slots.
  spec.replicas = plan_replicas_;
  spec.min_replicas = std::max<uint32_t>(1, config_.min_replicas);
  spec.delta = plan_.summary.delta().enabled();
  spec.checks = plan_.summary.checks();
  // Plans with relays hold the senders' direct fallback ops, except in delta mode.
  spec.direct_fallback = !spec.delta && !plan_.relay_children.empty();
  spec.anchor = spec.delta && (delta_need_anchor_ ||
                               delta_since_anchor_ + 1 >=
                                   std::max<uint32_t>(1, plan_.summary.delta().anchor_every()));
  // The step's fence id: every write of this step carries it, and receivers refuse writes of
  // any other (a failed step's late writes); random, so a retried version gets a new one.
  static thread_local std::mt19937_64 rng(std::random_device{}());
  while (spec.step_id == 0) spec.step_id = rng();
  if (spec.delta) {
    while (spec.nonce == 0) spec.nonce = rng();
    absl::MutexLock slock(&state_mu_);
    // Every receiver of a delta step got every step since the anchor (any that did not forced
    // an anchor): the deltas apply on the last committed version.
    if (!spec.anchor) spec.delta_base_version = last_committed_;
  }
  return spec;
}

absl::Status ControllerCore::CaptureOnSenders(const CaptureTarget& target, uint64_t version,
                                              uint64_t step_id, uint32_t slot,
                                              Clock::time_point deadline,
                                              std::map<std::string, v1::AgentStepReport>* reports) {
  std::vector<AgentCall<v1::ExecuteRequest>> calls;
  const auto timeout = Until(deadline, std::chrono::milliseconds(3600000));
  for (const auto& a : target.senders) {
    AgentCall<v1::ExecuteRequest> c{a, {}};
    c.request.set_version(version);
    c.request.set_plan_id(target.plan_id);
    c.request.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
    c.request.set_capture_only(true);
    c.request.set_capture_slot(slot);
    c.request.set_step_id(step_id);  // an abort of the step stops and discards the capture
    calls.push_back(std::move(c));
  }
  std::vector<std::string> errors;
  for (auto& r : fleet_.Capture(calls, timeout)) {
    if (!r.status.ok()) {
      errors.push_back(absl::StrCat("agent ", r.agent, ": capture failed: ",
                                    r.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                        ? "no answer before the step deadline"
                                        : absl::StrCat("unreachable: ", r.status.error_message())));
    } else if (!r.response.report().ok()) {
      errors.push_back(absl::StrCat("agent ", r.agent, ": ", r.response.report().error()));
    } else {
      (*reports)[r.agent] = r.response.report();
    }
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::AbortedError(absl::StrJoin(errors, "; "));
}

namespace {
// What a capture step says it did: captured at once, or after the send of step `after`.
std::string CapturedHow(uint64_t after) {
  return after != 0 ? absl::StrCat("captured after step ", after, "'s send") : "captured";
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

uint64_t NewStepId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t id = 0;
  while (id == 0) id = rng();
  return id;
}
}  // namespace

ControllerCore::StepRun::StepRun(uint64_t v, std::chrono::milliseconds t,
                                 std::optional<uint32_t> staleness,
                                 const std::function<void(const v1::StepCaptured&)>& captured,
                                 std::vector<std::string> changed_tensors)
    : version(v),
      timeout(t),
      max_staleness(staleness),
      on_captured(captured),
      t0(Clock::now()),
      deadline(t0 + t) {
  changed = std::move(changed_tensors);
  result.set_version(v);
  result.set_started_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count());
}

v1::StepResult ControllerCore::FailStep(StepRun* run, const std::string& error) {
  delta_need_anchor_ = true;  // the destinations may hold part of this step
  v1::StepResult& result = run->result;
  result.set_ok(false);
  result.set_error(error);
  result.set_seconds(Since(run->t0));
  result.set_trainer_stall_seconds(run->stall >= 0 ? run->stall : result.seconds());
  spdlog::warn("step {} failed: {}", run->version, error);
  Record(result);
  return result;
}

v1::StepResult ControllerCore::Rollback(uint64_t to, const std::vector<int>& asked) {
  const auto t0 = Clock::now();
  v1::StepResult result;
  result.set_version(to);
  result.set_rollback(true);
  result.set_started_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count());
  auto fail = [&](const std::string& why) {
    result.set_ok(false);
    result.set_error(absl::StrCat("rollback to version ", to, ": ", why));
    result.set_seconds(Since(t0));
    spdlog::warn("{}", result.error());
    Record(result);
    return result;
  };
  absl::MutexLock lock(&plan_mu_);  // never while a step sends or a plan loads
  // The replicas and their agents, as the layouts say now.
  const std::shared_ptr<const std::map<int, ReplicaView>> census = Census();
  std::vector<int> replicas = asked;
  if (replicas.empty()) {
    for (const auto& [k, view] : *census) replicas.push_back(k);
  }
  if (replicas.empty()) return fail("no inference replica is registered");
  std::set<std::string> agents;
  for (int k : replicas) {
    auto it = census->find(k);
    if (it == census->end() || it->second.agents.empty()) {
      return fail(absl::StrCat("replica ", k, " has no agent registered"));
    }
    agents.insert(it->second.agents.begin(), it->second.agents.end());
  }
  const auto endpoints = membership_.Endpoints();
  auto round = [&](bool check_only) {
    std::vector<CallTarget<v1::RestoreVersionRequest>> targets;
    for (const auto& a : agents) {
      CallTarget<v1::RestoreVersionRequest> t{a, Endpoint(endpoints, a), {}};
      t.request.set_version(to);
      t.request.set_check_only(check_only);
      targets.push_back(std::move(t));
    }
    return FailedCalls(CallAll<v1::RestoreVersionRequest, v1::RestoreVersionResponse>(
        &channels_, targets, std::chrono::milliseconds(check_only ? 10000 : 120000),
        [](auto* s, auto* c, const auto& q, auto* cq) {
          return s->PrepareAsyncRestoreVersion(c, q, cq);
        }));
  };
  // Every agent keeps `to`, or nothing changes anywhere.
  if (std::string failed = round(true); !failed.empty()) return fail(failed);
  // From here a replica whose agent fails holds a mix: it is named, and the next step (a
  // dense anchor) rewrites it whole.
  delta_need_anchor_ = true;
  const std::string failed = round(false);
  {
    absl::MutexLock slock(&state_mu_);
    for (int k : replicas) ledger_.RolledBack(k, to);
  }
  for (int k : replicas) result.add_committed_replicas(k);
  if (!failed.empty()) return fail(absl::StrCat(failed, "; the next step rewrites them whole"));
  result.set_ok(true);
  result.set_seconds(Since(t0));
  spdlog::info("rolled back {} replica(s) to version {} in {:.3f} s", replicas.size(), to,
               result.seconds());
  Record(result);
  return result;
}

v1::StepResult ControllerCore::Step(uint64_t version, std::chrono::milliseconds timeout,
                                    std::optional<uint32_t> max_staleness,
                                    const std::function<void(const v1::StepCaptured&)>& on_captured,
                                    const std::vector<std::string>& changed, bool retry) {
  if (retry) {
    if (auto done = AlreadyCommitted(version)) return *done;
  }
  {
    absl::MutexLock slock(&state_mu_);
    step_in_progress_ = version;
  }
  PublishLedger();
  StepRun run(version, timeout, max_staleness, on_captured, changed);
  // Queue: the capture token (a step still capturing, or captured and waiting to send, goes
  // first), then the send lock or a place behind the capture step sending.
  auto ticket = pipeline_.Enter(version, run.deadline);
  if (!ticket.ok()) return FailStep(&run, std::string(ticket.status().message()));
  if (auto s = ChooseStepMode(&run, ticket->get()); !s.ok()) {
    return FailStep(&run, std::string(s.message()));
  }
  // The step's fence id, picked now: an abort that discards this step's captures names it, so
  // it never cancels the step still sending on the same agents.
  run.step_id = NewStepId();
  if (run.capture) {
    if (auto s = CapturePhase(&run, ticket->get()); !s.ok()) {
      return FailStep(&run, std::string(s.message()));
    }
  }
  return SendPhase(&run, ticket->get());
}

absl::Status ControllerCore::ChooseStepMode(StepRun* run, StepPipeline::Ticket* ticket) {
  if (ticket->holds_send_lock()) {
    if (auto s = ReadyForStep(run->version, run->deadline, run->max_staleness); !s.ok()) {
      return s;
    }
    run->capture = plan_.capture_slots > 0;
    if (!run->capture) {
      ticket->ReleaseToken();  // in place: a step coming now is refused, as ever
      return absl::OkStatus();
    }
    run->target.plan_id = plan_.summary.plan_id();
    run->target.slots = plan_.capture_slots;
    for (const auto& a : senders_) {
      if (!plan_.relay_only.count(a)) run->target.senders.push_back(a);
    }
  } else {
    if (run->version <= ticket->ahead()) {
      return absl::FailedPreconditionError(absl::StrCat("version ", run->version,
                                                        " is not newer than version ",
                                                        ticket->ahead(), ", which is being sent"));
    }
    run->target = ticket->behind();
    run->capture = true;
  }
  run->how = CapturedHow(ticket->waited_for_send());
  // A capture slot: free at once, or once the send holding it is over (by the deadline).
  uint64_t after_send = 0;
  auto slot = ticket->TakeSlot(run->target, run->deadline, &after_send);
  if (!slot.ok()) return slot.status();
  run->slot = *slot;
  if (after_send != 0) run->how = CapturedHow(after_send);
  return absl::OkStatus();
}

absl::Status ControllerCore::CapturePhase(StepRun* run, StepPipeline::Ticket* ticket) {
  const CaptureTarget& target = run->target;
  auto abort = [&](const absl::Status& s) {
    protocol_.AbortEverywhere(run->version, target.senders, std::string(s.message()), run->step_id);
    return s;
  };
  if (auto s = CaptureOnSenders(target, run->version, run->step_id, run->slot, run->deadline,
                                &run->captures);
      !s.ok()) {
    return abort(s);
  }
  run->stall = Since(run->t0);
  run->result.set_capture(run->how);
  run->result.set_trainer_stall_seconds(run->stall);
  spdlog::info("step {}: {} on {} sender(s) in {:.3f} s", run->version, run->how,
               target.senders.size(), run->stall);
  if (run->on_captured) {
    v1::StepCaptured c;
    c.set_version(run->version);
    c.set_seconds(run->stall);
    c.set_how(run->how);
    run->on_captured(c);
  }
  // Behind a send: the send lock once that step is over; the plan must be the one captured
  // on (a plan made meanwhile discarded the captures on the senders).
  if (!ticket->holds_send_lock()) {
    if (auto s = ticket->AwaitSendLock(run->deadline); !s.ok()) return abort(s);
    if (auto s = StillReadyBehind(*run); !s.ok()) return abort(s);
  }
  // Later steps may capture behind this one's send from now on.
  ticket->OpenSend(target);
  return absl::OkStatus();
}

absl::Status ControllerCore::StillReadyBehind(const StepRun& run) {
  uint64_t last_committed;
  {
    absl::MutexLock slock(&state_mu_);
    last_committed = last_committed_;
  }
  if (!has_plan_ || plan_.summary.plan_id() != run.target.plan_id) {
    return absl::AbortedError(
        absl::StrCat("plan ", run.target.plan_id, " this step captured on was replaced by plan ",
                     has_plan_ ? plan_.summary.plan_id() : 0, " before it could send; step again"));
  }
  if (run.version <= last_committed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", run.version, " is not newer than the last committed version ", last_committed));
  }
  if (std::string lost = membership_.FirstLost(run.target.senders); !lost.empty()) {
    return absl::UnavailableError(absl::StrCat("agent ", lost, " is lost (no heartbeat)"));
  }
  if (run.max_staleness) {
    if (std::string behind_by = TooStale(*run.max_staleness); !behind_by.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat("max_staleness ", *run.max_staleness, " would be exceeded: ", behind_by));
    }
  }
  return absl::OkStatus();
}

absl::Status ControllerCore::ChoosePartial(const std::vector<std::string>& changed, StepSpec* spec,
                                           v1::StepResult* result) {
  const bool frozen = !frozen_.empty() && frozen_sent_;
  if (changed.empty() && !frozen) return absl::OkStatus();
  if (!changed.empty() && (spec->delta || !plan_.relay_children.empty())) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", spec->version,
                     " names the tensors it changed, but partial steps need a dense "
                     "plan without relays (this plan is ",
                     spec->delta ? "in delta mode" : "relayed", "): push the version whole"));
  }
  // A replica in the step that does not hold the last committed version (it missed steps, or
  // was rolled back) needs every tensor: the step runs whole.
  {
    absl::MutexLock slock(&state_mu_);
    for (const auto& [k, agents] : spec->replicas) {
      if (k < 0 || ledger_.committed_version(k) == last_committed_) continue;
      result->set_partial(absl::StrCat("whole: replica ", k, " holds version ",
                                       ledger_.committed_version(k), ", not ", last_committed_));
      return absl::OkStatus();
    }
  }
  spec->only_tensors = changed;
  if (frozen) spec->skip_tensors = frozen_;
  result->set_partial(absl::StrCat(
      "partial:", changed.empty() ? "" : absl::StrCat(" ", changed.size(), " changed pattern(s)"),
      frozen ? absl::StrCat(" ", frozen_.size(), " frozen pattern(s) skipped") : ""));
  return absl::OkStatus();
}

v1::StepResult ControllerCore::SendPhase(StepRun* run, StepPipeline::Ticket* ticket) {
  v1::StepResult& result = run->result;
  StepSpec spec = NextStep(run->version, run->t0, run->timeout);
  spec.step_id = run->step_id;
  spec.from_capture = run->capture;
  spec.capture_slot = run->capture ? run->slot : 0;
  // Replicas the plan left out (lost, incomplete) are skipped by this step too.
  for (const auto& [k, why] : plan_left_out_) {
    v1::SkippedReplica* skipped = result.add_skipped_replicas();
    skipped->set_replica(k);
    skipped->set_reason(absl::StrCat("left out of plan ", spec.plan_id, ": ", why));
  }
  if (spec.delta && !spec.anchor) {
    const auto p = delta_predictor_.Predict(plan_.summary);
    result.set_predicted_seconds(p.seconds);
    result.set_prediction(DeltaStepPredictor::Describe(p));
  } else {
    result.set_predicted_seconds(plan_.summary.predicted_step_seconds());
    result.set_prediction(absl::StrCat("plan ", spec.plan_id, " (dense)"));
  }
  if (auto s = ChoosePartial(run->changed, &spec, &result); !s.ok()) {
    ticket->ReleaseSlot();
    return FailStep(run, std::string(s.message()));
  }
  const absl::Status sent = protocol_.Run(spec, &result);
  ticket->ReleaseSlot();  // the send is over: a step waiting for a slot captures now
  for (auto& report : *result.mutable_agents()) {
    auto it = run->captures.find(report.agent());
    if (it == run->captures.end()) continue;
    report.set_capture_seconds(it->second.capture_seconds());
    report.set_capture_bytes(it->second.capture_bytes());
  }
  {
    absl::MutexLock slock(&state_mu_);
    if (result.committed_replicas_size() > 0) {
      std::map<int, std::string> digests;
      for (const auto& d : result.replica_digests()) digests[d.replica()] = d.digest();
      ledger_.Committed(run->version,
                        {result.committed_replicas().begin(), result.committed_replicas().end()},
                        digests);
    }
  }
  if (!sent.ok()) return FailStep(run, std::string(sent.message()));
  // Frozen tensors went to every replica of the plan once this whole step committed.
  if (spec.skip_tensors.empty() && spec.only_tensors.empty()) frozen_sent_ = true;
  if (spec.delta) {
    delta_since_anchor_ = spec.anchor || result.delta_anchor() ? 0 : delta_since_anchor_ + 1;
    // A replica dropped from this step holds an older version than the senders' shadows: the
    // next step must be dense for it, so it is an anchor.
    delta_need_anchor_ = result.skipped_replicas_size() > static_cast<int>(plan_left_out_.size());
  }
  result.set_ok(true);
  result.set_seconds(Since(run->t0));
  if (!run->capture) {
    result.set_capture("in place");
    result.set_trainer_stall_seconds(result.seconds());
  }
  LearnFrom(&result, run->timeout);
  spdlog::info("step {} committed to {} replica(s){}: {} bytes ({} dense{}) in {:.3f} s",
               run->version, result.committed_replicas_size(),
               result.skipped_replicas_size() == 0
                   ? ""
                   : absl::StrCat(", ", result.skipped_replicas_size(), " skipped"),
               result.bytes(), result.bytes_dense(),
               !spec.delta             ? ""
               : result.delta_anchor() ? ", delta anchor"
                                       : ", delta",
               result.seconds());
  if (!run->capture && run->on_captured) {
    v1::StepCaptured c;
    c.set_version(run->version);
    c.set_seconds(result.trainer_stall_seconds());
    c.set_how("in place");
    run->on_captured(c);
  }
  Record(result);
  return result;
}

void ControllerCore::LearnFrom(v1::StepResult* result, std::chrono::milliseconds timeout) {
  delta_predictor_.Observe(*result, plan_.summary);
  if (result->delta_ops() > 0) return;  // a few bytes, CPU-bound: says nothing about links
  // Delta mode with relays runs the senders and then the relays, one after the other
  // (StepProtocol::ForwardAppliedDeltas): not the one overlapping transfer the learner models.
  if (plan_.summary.delta().enabled() && !plan_.relay_children.empty()) return;
  std::map<std::string, double> rated;  // agent -> GB/s of its rails between hosts
  for (const AgentRecord& a : membership_.Snapshot()) {
    double gbps = 0;
    for (const v1::NicInfo& n : a.info.nics()) {
      if (n.transport() != "local") gbps += n.gbps();
    }
    rated[a.info.name()] = gbps;
  }
  // Relay-only agents spend their step waiting for bytes to land: not a measure of their link.
  const std::string learned = link_learner_.Observe(*result, rated, plan_.relay_only);
  if (learned.empty()) return;
  spdlog::info("step {}: {}", result->version(), learned);
  const std::map<std::string, double> planned(plan_.summary.link_rate_scale().begin(),
                                              plan_.summary.link_rate_scale().end());
  const std::string why = link_learner_.ReplanReason(planned);
  if (why.empty()) return;
  {
    // A step captured on this plan waits to send: not now (a later step plans again).
    if (pipeline_.waiting_to_send() > 0) {
      spdlog::info("step {}: {}; not planning again while a captured step waits to send",
                   result->version(), why);
      return;
    }
  }
  // Planned now, not at the next step: the next step starts on the plan the links call for,
  // and the plan's time is not counted in it.
  const auto started = Clock::now();
  auto planned_again =
      PlanLocked(world_, std::chrono::milliseconds(0), started + timeout, /*elastic=*/true);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (planned_again.ok()) {
    result->set_replanned(absl::StrFormat("plan %d made in %.2f s after this step: %s",
                                          planned_again->plan_id(), seconds, why));
    spdlog::info("step {}: {}", result->version(), result->replanned());
  } else {
    // The next step plans again (ReplanIfChanged: no plan loaded).
    result->set_replanned(absl::StrCat("planning again after this step failed (", why,
                                       "): ", planned_again.status().message()));
    spdlog::warn("step {}: {}", result->version(), result->replanned());
  }
}

void ControllerCore::AbortInFlight(const std::string& reason) { protocol_.AbortInFlight(reason); }

std::vector<ControllerCore::ReplicaVersion> ControllerCore::ReplicaVersions() const {
  absl::MutexLock lock(&state_mu_);
  std::vector<ReplicaVersion> out;
  for (int k : ledger_.Known()) {
    out.push_back({k, ledger_.committed_version(k), ledger_.Staleness(k)});
  }
  return out;
}

v1::PlanSummary ControllerCore::CurrentPlan() const {
  absl::MutexLock lock(&state_mu_);
  return summary_valid_ ? summary_ : v1::PlanSummary();
}

std::shared_ptr<const std::map<int, ReplicaView>> ControllerCore::Census() const {
  // Read before the snapshot: a change in between only makes the next call count again.
  const uint64_t version = membership_.layout_version();
  {
    absl::MutexLock lock(&census_mu_);
    if (census_ && census_version_ == version) return census_;
  }
  auto census = std::make_shared<const std::map<int, ReplicaView>>(
      CensusReplicas(membership_.Snapshot(), config_.world.inference_ranks_per_replica));
  absl::MutexLock lock(&census_mu_);
  census_ = census;
  census_version_ = version;
  return census;
}

v1::StatusResponse ControllerCore::Status() const {
  v1::StatusResponse s;
  s.set_version(wb::version::Number());
  s.set_epoch(membership_.epoch());
  const auto now = Clock::now();
  for (const auto& a : membership_.Snapshot()) {
    auto* st = s.add_agents();
    *st->mutable_info() = a.info;
    st->set_state(a.lost ? v1::AGENT_LIVENESS_LOST : v1::AGENT_LIVENESS_ALIVE);
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
  s.set_min_replicas(config_.min_replicas);
  // Replica states from the layouts as they are now (docs/elastic.md).
  const std::shared_ptr<const std::map<int, ReplicaView>> census_now = Census();
  const auto& census = *census_now;
  std::set<int> known;
  for (int k : ledger_.Known()) known.insert(k);
  for (const auto& [k, view] : census) known.insert(k);
  for (int k : known) {
    v1::ReplicaStatus* r = s.add_replicas();
    r->set_replica(k);
    r->set_committed_version(ledger_.committed_version(k));
    r->set_digest(ledger_.digest(k));
    r->set_staleness(ledger_.Staleness(k));
    auto it = census.find(k);
    const bool complete = it != census.end() && it->second.complete;
    if (it != census.end()) {
      for (const auto& a : it->second.agents) r->add_agents(a);
      for (const auto& a : it->second.lost_agents) r->add_agents(a);
    }
    r->set_state(!complete ? v1::REPLICA_STATE_LOST
                 : r->committed_version() == ledger_.latest() && ledger_.latest() > 0
                     ? v1::REPLICA_STATE_SERVING
                     : v1::REPLICA_STATE_CATCHING_UP);
  }
  return s;
}

}  // namespace wb::controller
