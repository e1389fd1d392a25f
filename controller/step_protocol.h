// One step's commit protocol over an AgentFleet, as named phases: begin on the receivers, execute
// on the senders (the barrier: every sender answers), commit on the receivers. The commit policy
// (docs/elastic.md): a receiving replica that fails in any phase is dropped from the step (its
// agents aborted) and the step goes on with the others while at least `min_replicas` remain; a
// failing sender fails the step. Errors name the agent and the cause. A replica spread over
// several agents commits in two rounds (prepare on each, then announce), so its watchers see
// commit(v) on all of its agents or on none.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "controller/agent_fleet.h"
#include "weightbeam/v1/controller.pb.h"

namespace wb::controller {

// What one step needs from the plan and the controller's delta bookkeeping.
struct StepSpec {
  uint64_t version = 0;
  uint64_t plan_id = 0;
  // The step's fence id, carried by Begin, Execute, Commit and Abort (and by every write): 0
  // picks a random one in Run.
  uint64_t step_id = 0;
  std::vector<std::string> senders;
  std::vector<std::string> receivers;
  // The step's deadline is `started + timeout`; every phase gets what is left of it.
  std::chrono::steady_clock::time_point started;
  std::chrono::milliseconds timeout{0};
  // Delta mode: whether this step is a dense anchor, and the nonce marking its receive slots.
  bool delta = false;
  bool anchor = false;
  // Partial steps: the senders run only the ops of tensors matching `only_tensors` and none of
  // `skip_tensors` (ExecuteRequest).
  std::vector<std::string> only_tensors, skip_tensors;
  // Checked on every receiver before it commits (CommitRequest.checks).
  weightbeam::v1::VersionChecks checks;
  uint64_t nonce = 0;
  // Delta mode, not an anchor: the version every receiver must hold for the deltas to apply.
  uint64_t delta_base_version = 0;
  // The receiving agents of each inference replica. A replica is committed only when all of its
  // agents commit; one failing agent drops every replica it holds a part of. Receivers in no
  // replica count as one replica each (numbered from -1 down).
  std::map<int, std::vector<std::string>> replicas;
  // The step fails unless at least this many replicas commit.
  uint32_t min_replicas = 1;
  // Relays: who each relay feeds (a dropped relay takes its subtree with it for the step), and
  // the relays that send nothing of their own (not asked to execute once dropped).
  std::map<std::string, std::vector<std::string>> relay_children;
  std::set<std::string> relay_only;
  // The longest a receiver's commit may wait for its watchers (staged receive,
  // AgentInfo.commit_wait_ms): commit and announce calls allow that much more.
  std::chrono::milliseconds commit_wait{0};
  // Senders the execute phase leaves out (run later, by ForwardAppliedDeltas).
  std::set<std::string> hold_back;
  // Relays with direct fallback (not in delta mode): the senders hold the direct ops to every
  // relayed replica (TransferOp.fallback), so a dropped relay's children can be fed by them in
  // the same step when the deadline allows (`predicted_seconds`: the plan's step time).
  bool direct_fallback = false;
  double predicted_seconds = 0;
  // The receivers fed directly in this attempt (their relay was dropped).
  std::set<std::string> direct;
  // A capture step (docs/clients.md): the senders (not the relay-only ones) captured this
  // version into `capture_slot` and send from there.
  bool from_capture = false;
  uint32_t capture_slot = 0;
};

// Which replicas of a step are still in it, and why the others were dropped. Dropping is closed
// over shared agents: an agent leaves with every replica it holds a part of, and a replica
// leaves with all of its agents.
class ReplicaBook {
 public:
  explicit ReplicaBook(const StepSpec& spec);

  // Drops every replica holding one of `failed` (agent -> why); returns the agents newly
  // excluded from the step (the failed ones and their replicas' other agents), sorted. A
  // dropped relay takes the replicas it feeds with it, unless `rescue`: then they stay, to be
  // fed by the senders directly (Direct()).
  std::vector<std::string> Drop(const std::map<std::string, std::string>& failed,
                                bool rescue = false);
  // The receivers still in the step whose relay was dropped with `rescue`.
  std::set<std::string> Direct() const;
  // Receivers still in the step, in the spec's order.
  std::vector<std::string> LiveReceivers() const;
  std::vector<std::string> ExcludedReceivers() const;
  std::vector<int> LiveReplicas() const;
  size_t live() const { return replicas_.size() - dropped_.size(); }
  size_t total() const { return replicas_.size(); }
  bool excluded(const std::string& agent) const { return excluded_.count(agent) > 0; }
  // Whether `agent` is all of every replica it holds part of: no other agent's failure can
  // drop it, so it may commit and announce in one call.
  bool Solo(const std::string& agent) const;
  // Adds the committed and skipped replicas to `result`.
  void Fill(weightbeam::v1::StepResult* result) const;
  // "replica 1 (agent inference-1: begin failed: ...); replica 2 (...)".
  std::string DroppedSummary() const;

 private:
  std::vector<std::string> receivers_;
  std::map<int, std::vector<std::string>> replicas_;
  std::map<std::string, std::set<int>> replicas_of_;  // agent -> replicas it holds part of
  std::map<int, std::string> dropped_;                // replica -> reason
  std::set<std::string> excluded_;
  std::map<std::string, std::vector<std::string>> relay_children_;
  std::set<std::string> direct_;
};

class StepProtocol {
 public:
  explicit StepProtocol(AgentFleet* fleet) : fleet_(fleet) {}

  // Runs the phases of one step. Adds the senders' reports, bytes and op counts to `result`
  // (and the delta anchor choice once begin succeeded), and which replicas committed and which
  // were skipped. A receiver failing begin or commit, or unreachable when a sender failed,
  // drops its replicas (their agents are told to abort); a sender failure that no receiver
  // explains fails the step. When a receiver drops out during execute the senders run again
  // without it (a fresh attempt: dense in delta mode) while the deadline allows. An error names
  // the agent; by then the agents involved were told to abort. One step at a time.
  absl::Status Run(const StepSpec& spec, weightbeam::v1::StepResult* result);
  // Aborts the step in flight, if any, on every agent it involves (callable from any thread).
  void AbortInFlight(const std::string& reason);

  // The phases, in order. Begin and commit go to `receivers` and return the failed ones (agent
  // -> error); execute skips the destinations in `skip`.
  std::map<std::string, std::string> BeginOnReceivers(const StepSpec& spec,
                                                      const std::vector<std::string>& receivers);
  absl::Status ExecuteOnSenders(const StepSpec& spec, const std::vector<std::string>& skip,
                                weightbeam::v1::StepResult* result);
  // Agents in `prepare` commit without announcing (CommitRequest.prepare); AnnounceOnReceivers
  // then announces on them (CommitRequest.announce) once every agent of their replicas has
  // prepared.
  std::map<std::string, std::string> CommitOnReceivers(const StepSpec& spec,
                                                       const std::vector<std::string>& receivers,
                                                       weightbeam::v1::StepResult* result,
                                                       const std::set<std::string>& prepare = {});
  // Both add the pauses of the replicas they announce on to `result` (replica_pauses,
  // inference_pause_seconds): per replica the longest its agents' live tensors were written.
  std::map<std::string, std::string> AnnounceOnReceivers(const StepSpec& spec,
                                                         const std::vector<std::string>& receivers,
                                                         weightbeam::v1::StepResult* result);
  // Delta mode with relays: the senders' deltas land in the root relays' receive slots, not
  // where relays forward from. The roots apply them first (a commit with prepare: nothing
  // announced), then the relays forward the applied bytes, dense, down their trees (executing
  // again without receivers that drop out). Adds the roots to `prepared` (they announce with
  // the others); fails when fewer than min_replicas remain.
  absl::Status ForwardAppliedDeltas(StepSpec* spec, ReplicaBook* book,
                                    weightbeam::v1::StepResult* result,
                                    std::set<std::string>* prepared);
  // After a sender failed: the receivers among `receivers` that do not answer a health check
  // (agent -> why), i.e. the ones the failure is most likely about.
  std::map<std::string, std::string> UnreachableReceivers(
      const StepSpec& spec, const std::vector<std::string>& receivers);
  // Tells `agents` to abort `version` (best effort, 2 s); `step_id` names the step so that
  // an abort arriving late leaves a newer step alone. The agents in `still_sending` leave the
  // step as receivers only (AbortRequest.receiving_only): they send in the step's next attempt.
  // The receivers whose commit or announce call (`round`) failed are aborted first; those
  // whose staged swap had finished meanwhile (the call gave up while the copy ran) answer
  // that the version is live there, and leave `failed`: they count as committed.
  // VersionChecks.digest: each committed replica's digest of the version, and the version's.
  void AddDigests(weightbeam::v1::StepResult* result) const;
  // Replica `replica`'s digest of this step's version from its ranks' ("" : none reported).
  std::string ReplicaDigest(int replica) const;
  void KeepLateCommits(const StepSpec& spec, const std::string& round,
                       std::map<std::string, std::string>* failed);
  // Returns the agents that answered that the version was already live there (a staged swap
  // that finished before the abort: AbortResponse.already_committed).
  std::set<std::string> AbortEverywhere(uint64_t version, const std::vector<std::string>& agents,
                                        const std::string& reason, uint64_t step_id = 0,
                                        const std::set<std::string>& still_sending = {});

 private:
  AgentFleet* fleet_;
  absl::Mutex mu_;
  // The step in flight (version 0: none) and the agents it involves, for AbortInFlight.
  uint64_t inflight_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t inflight_step_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> inflight_agents_ ABSL_GUARDED_BY(mu_);
  bool inflight_aborted_ ABSL_GUARDED_BY(mu_) = false;  // no more attempts
  // VersionChecks.digest: replica -> rank -> digest from the running step's commit answers
  // (Run is called for one step at a time).
  std::map<int, std::map<int, uint64_t>> rank_digests_;
};

}  // namespace wb::controller
