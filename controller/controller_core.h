// The controller's state machine: builds the plan from the agents' layouts (once, again only
// after the layout changed), loads it onto the senders, and runs steps with the commit protocol
// of step_protocol.h (begin on receivers -> execute on senders -> commit on receivers, or abort
// everywhere with an error naming the agent and the cause) over the agents' gRPC services.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/broadcast.h"
#include "config/config.h"
#include "controller/agent_calls.h"
#include "controller/delta_prediction.h"
#include "controller/grpc_agent_fleet.h"
#include "controller/link_learning.h"
#include "controller/membership.h"
#include "controller/replica_census.h"
#include "controller/step_pipeline.h"
#include "controller/step_protocol.h"
#include "weightbeam/v1/controller.pb.h"

namespace wb::controller {

// What the planner produces for the controller: a summary and one plan per sending agent.
struct BuiltPlan {
  weightbeam::v1::PlanSummary summary;
  // By sending agent. Once loaded onto the senders, the controller keeps only the names and
  // plan ids here (a plan of 10^6 ops lives in the senders, not twice).
  std::map<std::string, weightbeam::v1::AgentPlan> agent_plans;
  // Relays (planner/relay.h): each relay's children, and the agents whose ops are all relay
  // ops (they send nothing of their own; a relay dropped from a step is not asked to execute).
  std::map<std::string, std::vector<std::string>> relay_children;
  std::set<std::string> relay_only;
  // Capture (docs/clients.md): the capture slots every sender that is not relay-only reported
  // at plan load (the fewest); 0 when any has none: steps read the trainer tensors in place.
  uint32_t capture_slots = 0;
};

// Pure: agents' layouts + config in, plan out (no I/O).
using PlanFunction = std::function<absl::StatusOr<BuiltPlan>(const std::vector<AgentRecord>& agents,
                                                             const config::ControllerConfig& config,
                                                             uint64_t plan_id)>;

class ControllerCore {
 public:
  ControllerCore(config::ControllerConfig config, uint64_t epoch, PlanFunction planner);

  Membership& membership() { return membership_; }
  Broadcaster<weightbeam::v1::StepResult>& steps() { return steps_; }
  // Channels to agents (main sets their TLS credentials and token).
  AgentChannels& agent_channels() { return channels_; }

  // Waits (without holding the plan lock, so steps go on) until the world is complete or the
  // wait ends, then plans. The wait is the request's `wait_ms`, clamped to the configured
  // `plan_wait_ms`; `cancelled` (the caller went away) ends it early.
  absl::StatusOr<weightbeam::v1::PlanSummary> Plan(
      const weightbeam::v1::PlanRequest& req, const std::function<bool()>& cancelled = nullptr);
  // The pieces of Plan for a caller that waits by itself (ControllerService's scheduler):
  // the world a request asks for (the configured one when it names none), refused at once
  // when absurdly large; how long it may wait; whether it is complete; plan it now.
  absl::StatusOr<weightbeam::v1::ExpectedWorld> RequestedWorld(
      const weightbeam::v1::PlanRequest& req) const;
  std::chrono::milliseconds PlanWait(const weightbeam::v1::PlanRequest& req) const;
  bool WorldReady(const weightbeam::v1::ExpectedWorld& world, std::string* missing);
  absl::StatusOr<weightbeam::v1::PlanSummary> PlanNow(const weightbeam::v1::PlanRequest& req,
                                                      const weightbeam::v1::ExpectedWorld& world);
  // Commits `version` to the healthy inference replicas (docs/elastic.md). With
  // `max_staleness`, first waits (within `timeout`) until no known replica left out of the step
  // would be more than that many committed versions behind.
  //
  // On a capture plan (every sender has capture slots) the senders first capture the bytes
  // they send, and `on_captured` is called once all have (the trainer may go on); a step that
  // comes while the previous one sends captures at once when a slot is free, else after that
  // send, and sends after it (in capture order). On an in-place plan `on_captured` comes just
  // before the result, and one step or plan runs at a time as before.
  // `changed`: a partial step's changed tensor patterns (StepRequest.changed; empty: all).
  // `retry` (StepRequest.retry): the version committed last is answered as committed.
  weightbeam::v1::StepResult Step(
      uint64_t version, std::chrono::milliseconds timeout,
      std::optional<uint32_t> max_staleness = std::nullopt,
      const std::function<void(const weightbeam::v1::StepCaptured&)>& on_captured = nullptr,
      const std::vector<std::string>& changed = {}, bool retry = false);
  // Makes kept version `to` live again on `replicas` (empty: every known replica) with a
  // local copy on each agent (RollbackRequest); the next step is a dense anchor in delta mode.
  weightbeam::v1::StepResult Rollback(uint64_t to, const std::vector<int>& replicas);
  // Aborts the step in flight, if any, on every agent it involves (SIGTERM): its senders
  // cancel, so Step returns promptly with the failure, and watchers see abort(`reason`).
  void AbortInFlight(const std::string& reason);
  weightbeam::v1::StatusResponse Status() const;
  // Each known inference replica's committed version and staleness (no layout census: cheap).
  struct ReplicaVersion {
    int replica = 0;
    uint64_t committed_version = 0;
    uint64_t staleness = 0;
  };
  std::vector<ReplicaVersion> ReplicaVersions() const;
  // The summary of the current plan (all zero before the first plan).
  weightbeam::v1::PlanSummary CurrentPlan() const;
  // Marks lost agents; run periodically.
  void Sweep();

  // High availability (issue 45, controller_takeover.cc). `sink` gets the ledger after every
  // step result and when a step starts, on the step's thread: it must not block (it queues).
  void SetLedgerSink(std::function<void(weightbeam::v1::ControllerLedger)> sink);
  weightbeam::v1::ControllerLedger Ledger() const;
  // This controller was elected: goes on from `saved` (the ledger the last leader wrote). Waits
  // (until `deadline`) for the saved plan's agents to register, plans again for the saved
  // request (the same hash when the layouts are the same), and asks the receivers what they
  // committed: a step whose commit reached a replica counts as committed (the old leader's
  // commit completed it); one that reached none is aborted on every agent. Returns what it
  // found, for the log.
  std::string TakeOver(const weightbeam::v1::ControllerLedger& saved,
                       std::chrono::steady_clock::time_point deadline);

 private:
  // Plans for `w`: an explicit Plan waits (up to `wait`) for all of it; a step's replan
  // (`elastic`) takes the inference replicas that are complete now, at least min_replicas.
  // Every call to an agent ends by `deadline`.
  absl::StatusOr<weightbeam::v1::PlanSummary> PlanLocked(
      const weightbeam::v1::ExpectedWorld& w, std::chrono::milliseconds wait,
      std::chrono::steady_clock::time_point deadline, bool elastic)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(plan_mu_);
  // The agents and replicas a plan covers: the alive agents that described their layout, with
  // the tensors of incomplete inference replicas left out (elastic) and why each was left out.
  absl::StatusOr<std::vector<AgentRecord>> PlanInput(const weightbeam::v1::ExpectedWorld& world,
                                                     const std::set<std::string>& silent,
                                                     bool elastic,
                                                     std::map<int, std::string>* left_out,
                                                     std::map<int, ReplicaView>* replicas);
  // `agent`'s control endpoint in `endpoints` (from Membership::Endpoints), or "".
  static std::string Endpoint(const std::map<std::string, std::string>& endpoints,
                              const std::string& agent);
  // Tells every agent in `agents` which senders of `built` will connect to it (Agent.Introduce).
  absl::Status IntroduceSenders(const BuiltPlan& built, const std::vector<AgentRecord>& agents,
                                uint64_t plan_id,
                                const std::map<std::string, std::string>& endpoints,
                                std::chrono::steady_clock::time_point deadline);
  // Loads each agent's plan (Agent.LoadPlan, in parallel) and returns every answer. The plans
  // travel in the requests and are put back afterwards: a plan of 10^6 ops is never copied.
  std::vector<CallResult<weightbeam::v1::LoadPlanResponse>> LoadPlans(
      std::map<std::string, weightbeam::v1::AgentPlan>* plans,
      const std::map<std::string, std::string>& endpoints,
      std::chrono::steady_clock::time_point deadline);
  // Asks every alive agent for its current layout (Describe) and records changes; returns the
  // agents that did not answer (left out of the plan being made).
  std::set<std::string> RefreshLayouts(std::chrono::steady_clock::time_point deadline);
  // Before a step: `version` is new, a plan for the current layout is loaded (planning again
  // when the layout changed) and no agent it involves is lost.
  absl::Status ReadyForStep(uint64_t version, std::chrono::steady_clock::time_point deadline,
                            std::optional<uint32_t> max_staleness)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(plan_mu_);
  // Plans again when the layout or membership changed since the plan.
  absl::Status ReplanIfChanged(uint64_t version, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(plan_mu_);
  // max_staleness: the known replicas the plan leaves out that would be more than `bound`
  // versions behind after one more commit ("" when none).
  std::string TooStale(uint32_t bound) ABSL_EXCLUSIVE_LOCKS_REQUIRED(plan_mu_);
  // The plan's senders and receivers, the step's deadline and its delta anchor choice.
  StepSpec NextStep(uint64_t version, std::chrono::steady_clock::time_point started,
                    std::chrono::milliseconds timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(plan_mu_);
  void Record(const weightbeam::v1::StepResult& r);
  // The answer to a retried Step of the version committed last (nullopt: not that version).
  std::optional<weightbeam::v1::StepResult> AlreadyCommitted(uint64_t version);
  // Hands the ledger to the sink (if any).
  void PublishLedger();
  // TakeOver's parts: the ledger restored; the receivers' committed versions adopted (returns
  // the versions found); the step in flight aborted where it did not commit.
  void RestoreLedger(const weightbeam::v1::ControllerLedger& saved);
  std::string AdoptReceiverVersions(uint64_t in_progress);
  // One step as it goes through the pipeline (step_pipeline.h): what it asked for, what it
  // chose (capture or in place, the target and slot), what it captured, and its result.
  struct StepRun {
    StepRun(uint64_t version, std::chrono::milliseconds timeout,
            std::optional<uint32_t> max_staleness,
            const std::function<void(const weightbeam::v1::StepCaptured&)>& on_captured,
            std::vector<std::string> changed = {});
    const uint64_t version;
    const std::chrono::milliseconds timeout;
    const std::optional<uint32_t> max_staleness;
    const std::function<void(const weightbeam::v1::StepCaptured&)>& on_captured;
    const std::chrono::steady_clock::time_point t0, deadline;
    weightbeam::v1::StepResult result;
    bool capture = false;
    CaptureTarget target;
    uint32_t slot = 0;
    std::string how = "in place";
    uint64_t step_id = 0;
    double stall = -1;  // until every sender captured; the whole step when it did not get there
    std::map<std::string, weightbeam::v1::AgentStepReport> captures;
    std::vector<std::string> changed;  // StepRequest.changed
  };
  // A partial step (changed tensors, frozen ones): the senders' tensor filter, or why it runs
  // whole (result.partial); refused for a delta or relayed plan when `changed` is given.
  absl::Status ChoosePartial(const std::vector<std::string>& changed, StepSpec* spec,
                             weightbeam::v1::StepResult* result);
  // The phases of Step. Mode: with the send lock, the plan is ready for the step and says
  // capture or in place; behind a send, the step captures on that step's target; a capture
  // step then takes a slot. Capture: the senders capture (then the trainer may go on); a step
  // behind a send waits for the send lock and checks that its plan still holds. Send: the step
  // protocol, then what the step taught. Each failure is recorded by FailStep. The plan lock
  // (the send lock) is the ticket's: held once ticket->holds_send_lock(), which the static
  // analysis cannot follow, hence ABSL_NO_THREAD_SAFETY_ANALYSIS where plan state is read.
  absl::Status ChooseStepMode(StepRun* run,
                              StepPipeline::Ticket* ticket) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::Status CapturePhase(StepRun* run, StepPipeline::Ticket* ticket);
  absl::Status StillReadyBehind(const StepRun& run) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  weightbeam::v1::StepResult SendPhase(StepRun* run,
                                       StepPipeline::Ticket* ticket) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  weightbeam::v1::StepResult FailStep(StepRun* run, const std::string& error);
  // The capture phase: every sender of `target` copies version `version`'s bytes into `slot`.
  // Fails naming each sender that did not (their captures are discarded by the caller).
  absl::Status CaptureOnSenders(const CaptureTarget& target, uint64_t version, uint64_t step_id,
                                uint32_t slot, std::chrono::steady_clock::time_point deadline,
                                std::map<std::string, weightbeam::v1::AgentStepReport>* reports);
  // After a committed step: what it teaches the delta predictor and the link learner, and a new
  // plan (named in `result->replanned`) when the links it measured differ from the plan's.
  void LearnFrom(weightbeam::v1::StepResult* result, std::chrono::milliseconds timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(plan_mu_);
  // The replica census of the layouts as they are now, counted again only after they changed:
  // Status is polled, and counting walks every tensor (10^6 per agent).
  std::shared_ptr<const std::map<int, ReplicaView>> Census() const;
  // Delta mode: loads the receiving half of the plan (receive regions) on the receivers and
  // adds their regions and slots to the senders' plans.
  absl::Status LoadDeltaReceivers(BuiltPlan* built,
                                  const std::map<std::string, std::string>& endpoints,
                                  std::chrono::steady_clock::time_point deadline);

  const config::ControllerConfig config_;
  Membership membership_;
  PlanFunction planner_;
  AgentChannels channels_;
  GrpcAgentFleet fleet_{&channels_, &membership_, config_.step_links};
  StepProtocol protocol_{&fleet_};  // tracks the step in flight for AbortInFlight
  Broadcaster<weightbeam::v1::StepResult> steps_;

  absl::Mutex plan_mu_;  // held for a whole Plan or Step: one at a time
  bool has_plan_ ABSL_GUARDED_BY(plan_mu_) = false;
  BuiltPlan plan_ ABSL_GUARDED_BY(plan_mu_);
  uint64_t plan_layout_version_ ABSL_GUARDED_BY(plan_mu_) = 0;
  uint64_t next_plan_id_ ABSL_GUARDED_BY(plan_mu_) = 1;
  std::vector<std::string> senders_ ABSL_GUARDED_BY(plan_mu_);
  std::vector<std::string> receivers_ ABSL_GUARDED_BY(plan_mu_);
  // The world the last Plan asked for (the config's until then); steps replan for it.
  weightbeam::v1::ExpectedWorld world_ ABSL_GUARDED_BY(plan_mu_);
  // The plan's inference replicas and their receiving agents, and the known replicas it left
  // out with the reason (lost, incomplete). A plan that left out an agent that did not answer
  // Describe is made again at the next step.
  std::map<int, std::vector<std::string>> plan_replicas_ ABSL_GUARDED_BY(plan_mu_);
  std::map<int, std::string> plan_left_out_ ABSL_GUARDED_BY(plan_mu_);
  bool plan_partial_ ABSL_GUARDED_BY(plan_mu_) = false;
  // Delta mode: the next step must be a dense anchor (new plan, or a step failed: the
  // destinations may hold part of it); committed delta steps since the last anchor.
  std::atomic<bool> delta_need_anchor_{true};
  uint32_t delta_since_anchor_ ABSL_GUARDED_BY(plan_mu_) = 0;
  // The last Plan request's delta choice; replans after a layout change keep it.
  weightbeam::v1::DeltaChoice delta_choice_ ABSL_GUARDED_BY(plan_mu_) =
      weightbeam::v1::DELTA_CHOICE_CONFIG;
  // The same for relays, and for the checks every version of the plan passes before commit.
  weightbeam::v1::RelayChoice relay_choice_ ABSL_GUARDED_BY(plan_mu_) =
      weightbeam::v1::RELAY_CHOICE_CONFIG;
  weightbeam::v1::VersionChecks checks_ ABSL_GUARDED_BY(plan_mu_);
  // Frozen tensor patterns (PlanRequest.frozen), and whether a whole step of this plan sent them.
  std::vector<std::string> frozen_ ABSL_GUARDED_BY(plan_mu_);
  bool frozen_sent_ ABSL_GUARDED_BY(plan_mu_) = false;
  // Learned from committed steps: delta step rates, and link rates the next plan uses.
  DeltaStepPredictor delta_predictor_ ABSL_GUARDED_BY(plan_mu_){config_.delta};
  LinkLearner link_learner_ ABSL_GUARDED_BY(plan_mu_);

  // Capture steps in flight: the capture token, the slots and the order of sends, with
  // plan_mu_ as the send lock.
  StepPipeline pipeline_{&plan_mu_};

  mutable absl::Mutex census_mu_;
  mutable std::shared_ptr<const std::map<int, ReplicaView>> census_ ABSL_GUARDED_BY(census_mu_);
  mutable uint64_t census_version_ ABSL_GUARDED_BY(census_mu_) = 0;

  mutable absl::Mutex state_mu_;
  uint64_t last_committed_ ABSL_GUARDED_BY(state_mu_) = 0;
  ReplicaLedger ledger_ ABSL_GUARDED_BY(state_mu_);
  std::deque<weightbeam::v1::StepResult> recent_ ABSL_GUARDED_BY(state_mu_);
  // What the ledger keeps of the plan (ControllerLedger), and the step in flight.
  bool ledger_has_plan_ ABSL_GUARDED_BY(state_mu_) = false;
  weightbeam::v1::PlanRequest ledger_plan_request_ ABSL_GUARDED_BY(state_mu_);
  std::vector<std::string> ledger_plan_agents_ ABSL_GUARDED_BY(state_mu_);
  uint64_t step_in_progress_ ABSL_GUARDED_BY(state_mu_) = 0;
  std::function<void(weightbeam::v1::ControllerLedger)> ledger_sink_ ABSL_GUARDED_BY(state_mu_);
  weightbeam::v1::PlanSummary summary_ ABSL_GUARDED_BY(state_mu_);
  bool summary_valid_ ABSL_GUARDED_BY(state_mu_) = false;
  uint64_t summary_layout_version_ ABSL_GUARDED_BY(state_mu_) = 0;
};

// True when the layouts hold every trainer rank and every inference (replica, rank) of `world`;
// with an empty world, when at least one trainer and one inference tensor are registered.
bool WorldComplete(const std::vector<AgentRecord>& agents,
                   const weightbeam::v1::ExpectedWorld& world, std::string* missing);

}  // namespace wb::controller
