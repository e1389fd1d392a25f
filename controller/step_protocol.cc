#include "controller/step_protocol.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/wire/check_failed.h"
#include "common/wire/state_words.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

namespace {

// What is left of the step's deadline (at least 1 ms).
std::chrono::milliseconds Remaining(const StepSpec& spec) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(spec.started + spec.timeout -
                                                                    Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// Whether a dropped relay's children are fed by the senders in this step: the plan holds the
// direct ops, and at least twice the plan's step time is left.
bool CanFeedDirectly(const StepSpec& spec) {
  if (!spec.direct_fallback) return false;
  const double left = std::chrono::duration<double>(Remaining(spec)).count();
  return spec.predicted_seconds <= 0 || left >= 2 * spec.predicted_seconds;
}

// Begin and commit answer at once unless the agent stalls: 5 s, never past the step deadline
// (but at least 1 s, so a commit after a long transfer still gets its chance).
std::chrono::milliseconds QuickCallTimeout(const StepSpec& spec) {
  return std::clamp(Remaining(spec), std::chrono::milliseconds(1000),
                    std::chrono::milliseconds(5000));
}

// Commit and announce: as quick calls, plus what a staged receiver may wait for the watchers
// that acknowledge a version before its swap.
std::chrono::milliseconds CommitCallTimeout(const StepSpec& spec) {
  const std::chrono::milliseconds user_check =
      spec.checks.user() ? wire::UserCheckDeadline(spec.checks) : std::chrono::milliseconds(0);
  return QuickCallTimeout(spec) + spec.commit_wait + user_check;
}

// A version checked before it goes live (VersionChecks finite / user) is refused on every
// replica when it fails on one: every receiver prepares, and announces only once all passed.
// With digests too: every replica's digest is known before any announces, and goes with it.
bool ChecksBeforeLive(const StepSpec& spec) {
  return spec.checks.finite() || spec.checks.user() || spec.checks.digest();
}

// The commit errors that are a failed version check, not a lost or failing agent.
std::vector<std::string> CheckFailures(const std::map<std::string, std::string>& failed) {
  std::vector<std::string> out;
  for (const auto& [agent, why] : failed) {
    if (wire::IsCheckFailure(why)) out.push_back(why);
  }
  return out;
}

// The pauses of the replicas that `announced` (agent -> its commit answer; those that failed
// left out) completed: per replica whose every agent announced here, the longest of its
// agents; receivers outside any replica count towards inference_pause_seconds only.
void AddReplicaPauses(const StepSpec& spec,
                      const std::map<std::string, v1::CommitResponse>& announced,
                      const std::set<std::string>& failed, v1::StepResult* result) {
  if (result == nullptr || announced.empty()) return;
  std::set<std::string> in_replicas;
  for (const auto& [replica, agents] : spec.replicas) {
    double longest = 0;
    bool staged = false, any = false, whole = true;
    for (const auto& a : agents) {
      in_replicas.insert(a);
      if (failed.count(a)) whole = false;
      auto it = announced.find(a);
      if (it == announced.end()) continue;
      any = true;
      longest = std::max(longest, it->second.live_write_seconds());
      staged = staged || it->second.staged();
    }
    if (!any || !whole) continue;
    v1::ReplicaPause* p = result->add_replica_pauses();
    p->set_replica(replica);
    p->set_seconds(longest);
    p->set_staged(staged);
    result->set_inference_pause_seconds(std::max(result->inference_pause_seconds(), longest));
  }
  for (const auto& [agent, answer] : announced) {
    if (in_replicas.count(agent)) continue;
    result->set_inference_pause_seconds(
        std::max(result->inference_pause_seconds(), answer.live_write_seconds()));
  }
}

std::string CallError(const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return "no answer before the deadline (agent stalled or overloaded)";
  }
  return s.error_message();
}

}  // namespace

ReplicaBook::ReplicaBook(const StepSpec& spec)
    : receivers_(spec.receivers), relay_children_(spec.relay_children) {
  std::set<std::string> receiving(spec.receivers.begin(), spec.receivers.end());
  for (const auto& [replica, agents] : spec.replicas) {
    for (const auto& a : agents) {
      if (!receiving.count(a)) continue;  // a replica part this plan sends nothing to
      replicas_[replica].push_back(a);
      replicas_of_[a].insert(replica);
    }
  }
  int loose = -1;
  for (const auto& a : spec.receivers) {
    if (replicas_of_.count(a)) continue;
    replicas_[loose].push_back(a);
    replicas_of_[a].insert(loose--);
  }
}

std::vector<std::string> ReplicaBook::Drop(const std::map<std::string, std::string>& failed,
                                           bool rescue) {
  std::vector<std::string> pending;
  for (const auto& [agent, why] : failed) {
    pending.push_back(agent);
    for (int r : replicas_of_[agent]) {
      if (!dropped_.count(r)) dropped_[r] = absl::StrCat("agent ", agent, ": ", why);
    }
  }
  // Close over shared agents: every agent of a dropped replica leaves, with its replicas.
  std::set<std::string> newly;
  while (!pending.empty()) {
    const std::string agent = pending.back();
    pending.pop_back();
    if (excluded_.count(agent)) continue;
    excluded_.insert(agent);
    newly.insert(agent);
    for (int r : replicas_of_[agent]) {
      if (!dropped_.count(r)) {
        dropped_[r] = absl::StrCat("shares agent ", agent, " with a dropped replica");
      }
      for (const auto& other : replicas_[r]) {
        if (!excluded_.count(other)) pending.push_back(other);
      }
    }
    // A dropped relay's children get nothing this step (they leave with it), unless the senders
    // feed them directly.
    auto children = relay_children_.find(agent);
    if (children == relay_children_.end()) continue;
    if (rescue) {
      for (const auto& child : children->second) direct_.insert(child);
      continue;
    }
    for (const auto& child : children->second) {
      if (excluded_.count(child)) continue;
      for (int r : replicas_of_[child]) {
        if (!dropped_.count(r)) dropped_[r] = absl::StrCat("fed by relay ", agent, ", dropped");
      }
      pending.push_back(child);
    }
  }
  return {newly.begin(), newly.end()};
}

std::set<std::string> ReplicaBook::Direct() const {
  std::set<std::string> out;
  for (const auto& a : direct_) {
    if (!excluded_.count(a)) out.insert(a);
  }
  return out;
}

bool ReplicaBook::Solo(const std::string& agent) const {
  auto it = replicas_of_.find(agent);
  if (it == replicas_of_.end()) return true;
  for (int r : it->second) {
    auto agents = replicas_.find(r);
    if (agents != replicas_.end() && agents->second.size() > 1) return false;
  }
  return true;
}

std::vector<std::string> ReplicaBook::LiveReceivers() const {
  std::vector<std::string> out;
  for (const auto& a : receivers_) {
    if (!excluded_.count(a)) out.push_back(a);
  }
  return out;
}

std::vector<std::string> ReplicaBook::ExcludedReceivers() const {
  return {excluded_.begin(), excluded_.end()};
}

std::vector<int> ReplicaBook::LiveReplicas() const {
  std::vector<int> out;
  for (const auto& [r, agents] : replicas_) {
    if (!dropped_.count(r)) out.push_back(r);
  }
  return out;
}

void ReplicaBook::Fill(v1::StepResult* result) const {
  for (const auto& [r, agents] : replicas_) {
    auto it = dropped_.find(r);
    if (it == dropped_.end()) {
      if (r >= 0) result->add_committed_replicas(r);
      continue;
    }
    v1::SkippedReplica* s = result->add_skipped_replicas();
    s->set_replica(r);
    for (const auto& a : agents) s->add_agents(a);
    s->set_reason(it->second);
  }
}

std::string ReplicaBook::DroppedSummary() const {
  std::vector<std::string> parts;
  for (const auto& [r, why] : dropped_) {
    parts.push_back(r >= 0 ? absl::StrCat("replica ", r, " (", why, ")")
                           : absl::StrCat("receiver ", replicas_.at(r).front(), " (", why, ")"));
  }
  return absl::StrJoin(parts, "; ");
}

namespace {

// The error of a step that committed (or could commit) to fewer replicas than the floor.
absl::Status BelowFloor(const StepSpec& spec, const ReplicaBook& book, const std::string& what,
                        const std::string& cause) {
  std::string msg = absl::StrCat("below min_replicas (", spec.min_replicas, "): ", what, " ",
                                 book.live(), " of ", book.total(), " inference replica(s)");
  if (!book.DroppedSummary().empty()) absl::StrAppend(&msg, "; skipped: ", book.DroppedSummary());
  if (!cause.empty()) absl::StrAppend(&msg, "; ", cause);
  return absl::AbortedError(msg);
}

// A step's fence id when the caller did not pick one: random, never 0.
uint64_t NewStepId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

// The step's senders of their own bytes (not relay-only): an abort that drops one of them as a
// receiver must leave its sending side alone.
std::set<std::string> OwnSenders(const StepSpec& spec) {
  std::set<std::string> out;
  for (const auto& s : spec.senders) {
    if (!spec.relay_only.count(s)) out.insert(s);
  }
  return out;
}

// A fresh attempt's nonce: never 0, never the previous one.
uint64_t NextNonce(uint64_t nonce) { return nonce + 1 == 0 ? 1 : nonce + 1; }

}  // namespace

absl::Status StepProtocol::Run(const StepSpec& spec_in, v1::StepResult* result) {
  StepSpec spec = spec_in;  // a retried execute changes the nonce and the anchor choice
  while (spec.step_id == 0) spec.step_id = NewStepId();
  rank_digests_.clear();
  std::vector<std::string> involved = spec.senders;
  involved.insert(involved.end(), spec.receivers.begin(), spec.receivers.end());
  struct InFlight {
    StepProtocol* protocol;
    ~InFlight() {
      absl::MutexLock lock(&protocol->mu_);
      protocol->inflight_version_ = 0;
      protocol->inflight_agents_.clear();
    }
  } in_flight{this};
  {
    absl::MutexLock lock(&mu_);
    inflight_version_ = spec.version;
    inflight_step_id_ = spec.step_id;
    inflight_agents_ = involved;
    inflight_aborted_ = false;
  }
  ReplicaBook book(spec);
  // Aborts the agents `book` just excluded, so their watchers learn `version` is not coming.
  // An excluded receiver that also sends its own bytes (a trainer and a replica on one node)
  // stays a sender: its abort leaves the step's execute and capture alone.
  const std::set<std::string> own_senders = OwnSenders(spec);
  auto abort_dropped = [&](const std::vector<std::string>& agents, const std::string& why) {
    if (!agents.empty()) AbortEverywhere(spec.version, agents, why, spec.step_id, own_senders);
  };

  // Phase 1: begin. A receiver that fails it leaves the step with its replicas.
  if (auto failed = BeginOnReceivers(spec, spec.receivers); !failed.empty()) {
    auto excluded = book.Drop(failed, CanFeedDirectly(spec));
    const std::string why =
        absl::StrCat("agent ", failed.begin()->first, ": ", failed.begin()->second);
    if (book.live() < spec.min_replicas) {
      const absl::Status s = BelowFloor(spec, book, "began on", "");
      AbortEverywhere(spec.version, involved, std::string(s.message()), spec.step_id);
      return s;
    }
    spdlog::warn("step {}: dropped {}", spec.version, book.DroppedSummary());
    abort_dropped(excluded, why);
  }
  result->set_delta_anchor(spec.anchor);

  // Delta mode with relays: the relays forward once the roots have applied their deltas.
  const bool relay_after_apply = spec.delta && !spec.relay_children.empty();
  if (relay_after_apply) {
    for (const auto& [relay, children] : spec.relay_children) spec.hold_back.insert(relay);
  }

  // Phase 2: execute, again without the receivers that drop out while it runs.
  while (true) {
    v1::StepResult attempt;
    spec.direct = book.Direct();
    if (!spec.direct.empty()) {
      spdlog::warn("step {}: the senders feed {} directly (their relay was dropped)", spec.version,
                   absl::StrJoin(spec.direct, ", "));
    }
    const absl::Status s = ExecuteOnSenders(spec, book.ExcludedReceivers(), &attempt);
    // The result tells of the attempt that decided the step.
    result->clear_agents();
    for (const auto& r : attempt.agents()) *result->add_agents() = r;
    result->set_bytes(attempt.bytes());
    result->set_bytes_dense(attempt.bytes_dense());
    result->set_delta_ops(attempt.delta_ops());
    result->set_dense_ops(attempt.dense_ops());
    if (s.ok()) break;
    bool aborted;
    {
      absl::MutexLock lock(&mu_);
      aborted = inflight_aborted_;
    }
    auto gone = aborted ? std::map<std::string, std::string>()
                        : UnreachableReceivers(spec, book.LiveReceivers());
    if (gone.empty()) {  // the senders' own failure
      AbortEverywhere(spec.version, involved, std::string(s.message()), spec.step_id);
      return s;
    }
    auto excluded = book.Drop(gone, CanFeedDirectly(spec));
    if (book.live() < spec.min_replicas) {
      const absl::Status floor = BelowFloor(spec, book, "reachable:", std::string(s.message()));
      AbortEverywhere(spec.version, involved, std::string(floor.message()), spec.step_id);
      return floor;
    }
    spdlog::warn("step {}: {}; dropped {}; executing again without them", spec.version,
                 std::string(s.message()), book.DroppedSummary());
    abort_dropped(excluded, std::string(s.message()));
    // The failed attempt may have left slots and shadows half-updated: a fresh, dense attempt.
    spec.nonce = spec.delta ? NextNonce(spec.nonce) : 0;
    spec.anchor = spec.delta;
    spec.delta_base_version = 0;
    result->set_delta_anchor(spec.anchor);
  }

  std::set<std::string> prepared_early;  // the root relays, delta mode
  if (relay_after_apply) {
    if (auto s = ForwardAppliedDeltas(&spec, &book, result, &prepared_early); !s.ok()) {
      AbortEverywhere(spec.version, involved, std::string(s.message()), spec.step_id);
      return s;
    }
  }

  // Phase 3: commit on the receivers still in the step. An agent that is a whole replica by
  // itself commits and announces at once; the agents of a replica spread over several prepare
  // first, and announce only once all of them have (a failing one drops the replica, and its
  // prepared agents are aborted without ever having announced the version).
  std::vector<std::string> committing;
  std::set<std::string> prepare = prepared_early;
  for (const auto& a : book.LiveReceivers()) {
    if (prepared_early.count(a)) continue;
    committing.push_back(a);
    if (!book.Solo(a) || ChecksBeforeLive(spec)) prepare.insert(a);
  }
  auto failed = CommitOnReceivers(spec, committing, result, prepare);
  KeepLateCommits(spec, "commit", &failed);
  if (const auto refused = CheckFailures(failed); !refused.empty()) {
    // Nothing announced it yet: every replica keeps its live version.
    const std::string why = absl::StrJoin(refused, "; ");
    spdlog::error("step {}: refused on every replica: {}", spec.version, why);
    AbortEverywhere(spec.version, involved, why, spec.step_id);
    return absl::FailedPreconditionError(why);
  }
  std::vector<std::string> errors;
  if (!failed.empty()) {
    for (const auto& [agent, why] : failed) {
      errors.push_back(absl::StrCat("agent ", agent, ": commit failed: ", why));
    }
    const std::string why = absl::StrJoin(errors, "; ");
    std::map<std::string, std::string> as_commit;
    for (const auto& [agent, e] : failed) as_commit[agent] = absl::StrCat("commit failed: ", e);
    // The failed receivers and the prepared agents of their replicas tell their watchers; in
    // delta mode the senders drop their shadows.
    std::vector<std::string> to_abort = book.Drop(as_commit);
    // The failed receivers were aborted already (KeepLateCommits): the others of their
    // replicas are told now.
    to_abort.erase(std::remove_if(to_abort.begin(), to_abort.end(),
                                  [&](const std::string& a) { return failed.count(a) > 0; }),
                   to_abort.end());
    if (spec.delta) to_abort.insert(to_abort.end(), spec.senders.begin(), spec.senders.end());
    AbortEverywhere(spec.version, to_abort, why, spec.step_id);
  }
  // Announce on the prepared agents whose replicas are still whole.
  std::vector<std::string> announcing;
  for (const auto& a : book.LiveReceivers()) {
    if (prepare.count(a)) announcing.push_back(a);
  }
  auto unannounced = AnnounceOnReceivers(spec, announcing, result);
  KeepLateCommits(spec, "announce", &unannounced);
  if (!unannounced.empty()) {
    // Lost between the two rounds (it died, or the step was aborted there meanwhile): its
    // replica is dropped; the others of that replica announced already (docs/reliability.md).
    std::map<std::string, std::string> as_announce;
    for (const auto& [agent, e] : unannounced) {
      errors.push_back(absl::StrCat("agent ", agent, ": announce failed: ", e));
      as_announce[agent] = absl::StrCat("announce failed: ", e);
    }
    book.Drop(as_announce);  // they were aborted already (KeepLateCommits)
  }
  book.Fill(result);
  if (spec.checks.digest()) AddDigests(result);
  if (!errors.empty()) {
    if (book.live() < spec.min_replicas) return BelowFloor(spec, book, "committed to", "");
    spdlog::warn("step {}: {}", spec.version, absl::StrJoin(errors, "; "));
  }
  return absl::OkStatus();
}

absl::Status StepProtocol::ForwardAppliedDeltas(StepSpec* spec, ReplicaBook* book,
                                                v1::StepResult* result,
                                                std::set<std::string>* prepared) {
  // The roots: relays no other relay feeds.
  std::set<std::string> fed;
  for (const auto& [relay, children] : spec->relay_children)
    fed.insert(children.begin(), children.end());
  std::vector<std::string> roots;
  for (const auto& [relay, children] : spec->relay_children) {
    if (!fed.count(relay) && !book->excluded(relay)) roots.push_back(relay);
  }
  std::set<std::string> as_prepare(roots.begin(), roots.end());
  if (auto failed = CommitOnReceivers(*spec, roots, result, as_prepare); !failed.empty()) {
    std::map<std::string, std::string> why;
    for (const auto& [agent, e] : failed) why[agent] = absl::StrCat("commit failed: ", e);
    const auto excluded = book->Drop(why);
    if (book->live() < spec->min_replicas) return BelowFloor(*spec, *book, "applied on", "");
    spdlog::warn("step {}: dropped {}", spec->version, book->DroppedSummary());
    AbortEverywhere(spec->version, excluded, why.begin()->second, spec->step_id, OwnSenders(*spec));
  }
  for (const auto& r : roots) {
    if (!book->excluded(r)) prepared->insert(r);
  }
  // The relays forward, again without the receivers that drop out meanwhile (a relay's bytes
  // stay final for the step, so a second attempt forwards the same bytes).
  StepSpec relaying = *spec;
  relaying.senders.assign(spec->hold_back.begin(), spec->hold_back.end());
  relaying.hold_back.clear();
  while (true) {
    v1::StepResult attempt;
    const absl::Status s = ExecuteOnSenders(relaying, book->ExcludedReceivers(), &attempt);
    if (s.ok()) {
      for (const auto& r : attempt.agents()) *result->add_agents() = r;
      result->set_bytes(result->bytes() + attempt.bytes());
      result->set_bytes_dense(result->bytes_dense() + attempt.bytes_dense());
      result->set_dense_ops(result->dense_ops() + attempt.dense_ops());
      return absl::OkStatus();
    }
    auto gone = UnreachableReceivers(*spec, book->LiveReceivers());
    if (gone.empty()) return s;
    const auto excluded = book->Drop(gone);
    if (book->live() < spec->min_replicas) {
      return BelowFloor(*spec, *book, "reachable:", std::string(s.message()));
    }
    spdlog::warn("step {}: {}; dropped {}; relaying again without them", spec->version,
                 std::string(s.message()), book->DroppedSummary());
    AbortEverywhere(spec->version, excluded, std::string(s.message()), spec->step_id,
                    OwnSenders(*spec));
    for (auto it = prepared->begin(); it != prepared->end();) {
      it = book->excluded(*it) ? prepared->erase(it) : std::next(it);
    }
  }
}

std::map<std::string, std::string> StepProtocol::BeginOnReceivers(
    const StepSpec& spec, const std::vector<std::string>& receivers) {
  std::vector<AgentCall<v1::BeginRequest>> calls;
  for (const auto& a : receivers) {
    AgentCall<v1::BeginRequest> c{a, {}};
    c.request.set_version(spec.version);
    c.request.set_plan_id(spec.plan_id);
    c.request.set_step_id(spec.step_id);
    calls.push_back(std::move(c));
  }
  std::map<std::string, std::string> failed;
  for (const auto& r : fleet_->Begin(calls, QuickCallTimeout(spec))) {
    if (!r.status.ok()) failed[r.agent] = absl::StrCat("begin failed: ", CallError(r.status));
  }
  return failed;
}

absl::Status StepProtocol::ExecuteOnSenders(const StepSpec& spec,
                                            const std::vector<std::string>& skip,
                                            v1::StepResult* result) {
  std::vector<AgentCall<v1::ExecuteRequest>> calls;
  const std::set<std::string> skipped(skip.begin(), skip.end());
  std::map<std::string, std::string> parents;  // relayed receiver -> the relay feeding it
  for (const auto& [relay, children] : spec.relay_children) {
    for (const auto& child : children) parents[child] = relay;
  }
  for (const auto& a : spec.senders) {
    if (spec.relay_only.count(a) && skipped.count(a)) continue;  // a dropped relay
    if (spec.hold_back.count(a)) continue;
    AgentCall<v1::ExecuteRequest> c{a, {}};
    c.request.set_version(spec.version);
    c.request.set_plan_id(spec.plan_id);
    c.request.set_timeout_ms(static_cast<uint32_t>(Remaining(spec).count()));
    c.request.set_step_id(spec.step_id);
    c.request.set_delta_anchor(spec.anchor);
    c.request.set_step_nonce(spec.nonce);
    if (spec.from_capture && !spec.relay_only.count(a)) {
      c.request.set_from_capture(true);
      c.request.set_capture_slot(spec.capture_slot);
    }
    for (const auto& s : skip) c.request.add_skip_agents(s);
    for (const auto& d : spec.direct) c.request.add_direct_agents(d);
    for (const auto& t : spec.only_tensors) c.request.add_only_tensors(t);
    for (const auto& t : spec.skip_tensors) c.request.add_skip_tensors(t);
    // A relay waits on its parent, or on the senders once they feed it directly.
    if (spec.relay_children.count(a)) {
      const auto parent = parents.find(a);
      if (parent != parents.end() && !spec.direct.count(a)) {
        c.request.add_feeders(parent->second);
      } else {
        for (const auto& sender : spec.senders) {
          if (!spec.relay_only.count(sender)) c.request.add_feeders(sender);
        }
      }
    }
    calls.push_back(std::move(c));
  }
  // The barrier: every sender answers (its executor stops at the deadline it was given; 2 s
  // more for the answer to arrive).
  std::vector<std::string> errors;
  for (auto& r : fleet_->Execute(calls, Remaining(spec) + std::chrono::milliseconds(2000))) {
    v1::AgentStepReport* report = result->add_agents();
    if (!r.status.ok()) {
      report->set_agent(r.agent);
      report->set_error(r.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                            ? "no answer within the step timeout"
                            : absl::StrCat("unreachable: ", r.status.error_message()));
    } else {
      *report = r.response.report();
      report->set_agent(r.agent);
      result->set_bytes(result->bytes() + report->bytes_sent());
      result->set_bytes_dense(result->bytes_dense() + report->bytes_dense());
      result->set_delta_ops(result->delta_ops() + report->delta_ops());
      result->set_dense_ops(result->dense_ops() + report->dense_ops());
      if (report->ok()) continue;
    }
    errors.push_back(absl::StrCat("agent ", r.agent, ": ", report->error()));
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::AbortedError(absl::StrJoin(errors, "; "));
}

std::map<std::string, std::string> StepProtocol::UnreachableReceivers(
    const StepSpec& spec, const std::vector<std::string>& receivers) {
  std::vector<AgentCall<v1::HealthRequest>> calls;
  for (const auto& a : receivers) {
    AgentCall<v1::HealthRequest> c{a, {}};
    c.request.set_step_id(spec.step_id);
    calls.push_back(std::move(c));
  }
  // Short: a receiver that is there answers at once; never more than a quarter of what is left.
  const auto timeout = std::clamp(Remaining(spec) / 4, std::chrono::milliseconds(200),
                                  std::chrono::milliseconds(1000));
  std::map<std::string, std::string> gone;
  for (const auto& r : fleet_->Health(calls, timeout)) {
    if (!r.status.ok()) {
      gone[r.agent] = absl::StrCat("unreachable during execute: ", CallError(r.status));
    } else if (!r.response.serving()) {
      gone[r.agent] = absl::StrCat("not serving during execute (",
                                   wb::wire::StateWord(r.response.state()), ")");
    } else if (spec.step_id != 0 && !r.response.step_open()) {
      // It answers, but not as the process that began the step: restarted since (or the
      // step was closed there); the senders' writes to it cannot land.
      gone[r.agent] = "the step is not open there any more (restarted during execute?)";
    }
  }
  return gone;
}

std::map<std::string, std::string> StepProtocol::CommitOnReceivers(
    const StepSpec& spec, const std::vector<std::string>& receivers, v1::StepResult* result,
    const std::set<std::string>& prepare) {
  // Each sender's hashes go to their destination: one pass over all of them, not one per
  // receiver (that made a commit O(senders x receivers)).
  std::map<std::string, std::vector<const v1::OpHash*>> hashes_for;
  for (const auto& report : result->agents()) {
    for (const auto& h : report.hashes()) hashes_for[h.dst_agent()].push_back(&h);
  }
  std::vector<AgentCall<v1::CommitRequest>> calls;
  calls.reserve(receivers.size());
  for (const auto& a : receivers) {
    AgentCall<v1::CommitRequest> c{a, {}};
    c.request.set_version(spec.version);
    c.request.set_step_nonce(spec.nonce);
    c.request.set_step_id(spec.step_id);
    c.request.set_prepare(prepare.count(a) > 0);
    *c.request.mutable_checks() = spec.checks;
    if (spec.delta && !spec.anchor) c.request.set_delta_base_version(spec.delta_base_version);
    if (auto it = hashes_for.find(a); it != hashes_for.end()) {
      for (const v1::OpHash* h : it->second) *c.request.add_expected_hashes() = *h;
    }
    calls.push_back(std::move(c));
  }
  // The hashes travelled to the receivers; the step result does not need them.
  for (auto& report : *result->mutable_agents()) report.clear_hashes();
  std::map<std::string, std::string> failed;
  std::map<std::string, v1::CommitResponse> announced;  // those committing without prepare
  std::set<std::string> failing;
  for (auto& r : fleet_->Commit(calls, CommitCallTimeout(spec))) {
    if (r.status.ok()) {
      for (const auto& d : r.response.digests()) rank_digests_[d.replica()][d.rank()] = d.digest();
    }
    if (!r.status.ok()) {
      failed[r.agent] = CallError(r.status);
      failing.insert(r.agent);
    } else if (!prepare.count(r.agent)) {
      announced[r.agent] = std::move(r.response);
    }
  }
  AddReplicaPauses(spec, announced, failing, result);
  return failed;
}

std::map<std::string, std::string> StepProtocol::AnnounceOnReceivers(
    const StepSpec& spec, const std::vector<std::string>& receivers, v1::StepResult* result) {
  if (receivers.empty()) return {};
  // Every replica's digest, mixed once here rather than once per announcing agent.
  google::protobuf::RepeatedPtrField<v1::ReplicaDigest> digests;
  if (spec.checks.digest()) {
    for (const auto& [replica, ranks] : rank_digests_) {
      v1::ReplicaDigest* d = digests.Add();
      d->set_replica(replica);
      d->set_digest(ReplicaDigest(replica));
    }
  }
  std::vector<AgentCall<v1::CommitRequest>> calls;
  calls.reserve(receivers.size());
  for (const auto& a : receivers) {
    AgentCall<v1::CommitRequest> c{a, {}};
    c.request.set_version(spec.version);
    c.request.set_step_id(spec.step_id);
    c.request.set_announce(true);
    *c.request.mutable_replica_digests() = digests;
    calls.push_back(std::move(c));
  }
  std::map<std::string, std::string> failed;
  std::map<std::string, v1::CommitResponse> announced;
  std::set<std::string> failing;
  for (auto& r : fleet_->Commit(calls, CommitCallTimeout(spec))) {
    if (!r.status.ok()) {
      failed[r.agent] = CallError(r.status);
      failing.insert(r.agent);
    } else {
      announced[r.agent] = std::move(r.response);
    }
  }
  AddReplicaPauses(spec, announced, failing, result);
  return failed;
}

std::string StepProtocol::ReplicaDigest(int replica) const {
  auto it = rank_digests_.find(replica);
  if (it == rank_digests_.end()) return "";
  // Ranks in order, each a 64-bit digest: mixed into one (splitmix64 finalizer per value).
  uint64_t d = 0x6a09e667f3bcc908ull;
  for (const auto& [rank, digest] : it->second) {
    for (uint64_t x : {static_cast<uint64_t>(static_cast<uint32_t>(rank)), digest}) {
      d ^= x + 0x9e3779b97f4a7c15ull + (d << 6) + (d >> 2);
      d = (d ^ (d >> 30)) * 0xbf58476d1ce4e5b9ull;
      d = (d ^ (d >> 27)) * 0x94d049bb133111ebull;
      d ^= d >> 31;
    }
  }
  return absl::StrFormat("%016x", d);
}

void StepProtocol::AddDigests(v1::StepResult* result) const {
  std::set<std::string> seen;
  for (int replica : result->committed_replicas()) {
    std::string digest = ReplicaDigest(replica);
    if (digest.empty()) continue;
    v1::ReplicaDigest* r = result->add_replica_digests();
    r->set_replica(replica);
    r->set_digest(std::move(digest));
    seen.insert(r->digest());
  }
  if (seen.size() == 1) result->set_digest(*seen.begin());
  if (seen.size() > 1) {
    spdlog::warn("version {}: the committed replicas report {} different digests",
                 result->version(), seen.size());
  }
}

void StepProtocol::KeepLateCommits(const StepSpec& spec, const std::string& round,
                                   std::map<std::string, std::string>* failed) {
  if (failed->empty()) return;
  std::vector<std::string> agents;
  std::vector<std::string> errors;
  for (const auto& [agent, why] : *failed) {
    agents.push_back(agent);
    errors.push_back(absl::StrCat("agent ", agent, ": ", round, " failed: ", why));
  }
  for (const std::string& agent :
       AbortEverywhere(spec.version, agents, absl::StrJoin(errors, "; "), spec.step_id)) {
    spdlog::warn(
        "step {}: agent {}'s {} call failed ({}), but its staged swap had finished: "
        "the version is live there; counted committed",
        spec.version, agent, round, failed->at(agent));
    failed->erase(agent);
  }
}

std::set<std::string> StepProtocol::AbortEverywhere(uint64_t version,
                                                    const std::vector<std::string>& agents,
                                                    const std::string& reason, uint64_t step_id,
                                                    const std::set<std::string>& still_sending) {
  std::vector<AgentCall<v1::AbortRequest>> calls;
  for (const auto& a : agents) {
    AgentCall<v1::AbortRequest> c{a, {}};
    c.request.set_version(version);
    c.request.set_reason(reason);
    c.request.set_step_id(step_id);
    c.request.set_receiving_only(still_sending.count(a) > 0);
    calls.push_back(std::move(c));
  }
  std::set<std::string> live;
  for (const auto& r : fleet_->Abort(calls, std::chrono::milliseconds(2000))) {
    if (r.status.ok() && r.response.already_committed()) live.insert(r.agent);
  }
  return live;
}

void StepProtocol::AbortInFlight(const std::string& reason) {
  uint64_t version;
  uint64_t step_id;
  std::vector<std::string> agents;
  {
    absl::MutexLock lock(&mu_);
    version = inflight_version_;
    step_id = inflight_step_id_;
    agents = inflight_agents_;
  }
  if (version == 0) return;
  {
    absl::MutexLock lock(&mu_);
    inflight_aborted_ = true;
  }
  spdlog::warn("aborting step {} in flight: {}", version, reason);
  AbortEverywhere(version, agents, reason, step_id);
}

}  // namespace wb::controller
