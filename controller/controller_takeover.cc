// ControllerCore's part in high availability (issue 45): the ledger it hands to etcd, the
// takeover of a newly elected leader, and the answer to a retried step.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "controller/controller_core.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

void ControllerCore::SetLedgerSink(std::function<void(v1::ControllerLedger)> sink) {
  absl::MutexLock lock(&state_mu_);
  ledger_sink_ = std::move(sink);
}

v1::ControllerLedger ControllerCore::Ledger() const {
  v1::ControllerLedger l;
  absl::MutexLock lock(&state_mu_);
  l.set_epoch(channels_.LeaderEpoch());
  l.set_written_unix_ms(absl::ToUnixMillis(absl::Now()));
  l.set_has_plan(ledger_has_plan_);
  if (ledger_has_plan_) *l.mutable_plan_request() = ledger_plan_request_;
  if (summary_valid_) l.set_plan_hash(summary_.plan_hash());
  for (const auto& a : ledger_plan_agents_) l.add_plan_agents(a);
  l.set_last_committed_version(last_committed_);
  l.set_commits(ledger_.commits());
  for (const auto& [k, e] : ledger_.entries()) {
    v1::LedgerReplica* r = l.add_replicas();
    r->set_replica(k);
    r->set_version(e.version);
    r->set_commits_at(e.commits_at);
    r->set_digest(e.digest);
  }
  l.set_step_in_progress(step_in_progress_);
  return l;
}

void ControllerCore::PublishLedger() {
  std::function<void(v1::ControllerLedger)> sink;
  {
    absl::MutexLock lock(&state_mu_);
    sink = ledger_sink_;
  }
  if (sink) sink(Ledger());
}

std::optional<v1::StepResult> ControllerCore::AlreadyCommitted(uint64_t version) {
  absl::MutexLock lock(&state_mu_);
  if (version == 0 || version != last_committed_) return std::nullopt;
  v1::StepResult r;
  for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {
    if (it->ok() && !it->rollback() && it->version() == version) {
      r = *it;
      break;
    }
  }
  r.set_version(version);
  r.set_ok(true);
  r.set_error("");
  r.set_already_committed(true);
  if (r.committed_replicas_size() == 0) {
    for (const auto& [k, e] : ledger_.entries()) {
      if (e.version == version) r.add_committed_replicas(k);
    }
  }
  spdlog::info("step {}: already committed (a retry); nothing sent again", version);
  return r;
}

void ControllerCore::RestoreLedger(const v1::ControllerLedger& saved) {
  absl::MutexLock lock(&state_mu_);
  last_committed_ = std::max(last_committed_, saved.last_committed_version());
  if (saved.commits() >= ledger_.commits()) {
    std::map<int, ReplicaLedger::Entry> entries;
    for (const auto& r : saved.replicas()) {
      entries[r.replica()] = ReplicaLedger::Entry{r.version(), r.commits_at(), r.digest()};
    }
    ledger_.Restore(std::move(entries), saved.commits());
  }
  if (saved.has_plan()) {
    ledger_has_plan_ = true;
    ledger_plan_request_ = saved.plan_request();
    ledger_plan_agents_.assign(saved.plan_agents().begin(), saved.plan_agents().end());
  }
}

std::string ControllerCore::AdoptReceiverVersions(uint64_t in_progress) {
  std::map<int, std::vector<std::string>> replicas;
  std::vector<std::string> everyone;
  {
    absl::MutexLock lock(&plan_mu_);
    replicas = plan_replicas_;
    everyone = senders_;
    everyone.insert(everyone.end(), receivers_.begin(), receivers_.end());
  }
  const auto endpoints = membership_.Endpoints();
  std::vector<CallTarget<v1::HealthRequest>> targets;
  for (const auto& [k, agents] : replicas) {
    for (const auto& a : agents) targets.push_back({a, Endpoint(endpoints, a), {}});
  }
  std::map<std::string, uint64_t> answered;
  for (auto& r : CallAll<v1::HealthRequest, v1::HealthResponse>(
           &channels_, targets, std::chrono::milliseconds(5000),
           [](auto*s, auto*c, const auto&q, auto*cq) { return s->PrepareAsyncHealth(c, q, cq); })) {
    if (r.status.ok()) answered[r.agent] = r.response.committed_version();
  }
  // A replica holds the lowest version its agents committed; one with a silent agent is left
  // as the ledger says.
  std::map<uint64_t, std::vector<int>> newer;  // version -> replicas now known to hold it
  std::vector<std::string> found;
  std::set<int> at_in_progress;
  {
    absl::MutexLock lock(&state_mu_);
    for (const auto& [k, agents] : replicas) {
      uint64_t holds = UINT64_MAX;
      for (const auto& a : agents) {
        auto it = answered.find(a);
        holds = it == answered.end() ? 0 : std::min(holds, it->second);
      }
      if (agents.empty() || holds == 0 || holds == UINT64_MAX) continue;
      found.push_back(absl::StrCat("replica ", k, " at ", holds));
      if (holds == in_progress) at_in_progress.insert(k);
      if (holds > ledger_.committed_version(k)) newer[holds].push_back(k);
    }
    for (const auto& [version, ks] : newer) {
      ledger_.Committed(version, ks);
      last_committed_ = std::max(last_committed_, version);
    }
    step_in_progress_ = 0;
  }
  if (in_progress == 0) return absl::StrJoin(found, ", ");
  if (!at_in_progress.empty()) {
    // The old leader's commit reached these replicas: the step counts as committed there.
    v1::StepResult done;
    done.set_version(in_progress);
    done.set_ok(true);
    done.set_already_committed(true);
    for (int k : at_in_progress) done.add_committed_replicas(k);
    for (const auto& [k, agents] : replicas) {
      if (at_in_progress.count(k)) continue;
      v1::SkippedReplica* skipped = done.add_skipped_replicas();
      skipped->set_replica(k);
      skipped->set_reason("the leader driving the step died before its commit reached it");
    }
    Record(done);
  }
  // Wherever the step did not commit, it is aborted: its agents must not keep it open.
  std::vector<CallTarget<v1::AbortRequest>> aborts;
  const std::string reason =
      absl::StrCat("the controller leading step ", in_progress, " is gone; leader epoch ",
                   channels_.LeaderEpoch(), " aborted it");
  std::set<std::string> committed_agents;
  for (int k : at_in_progress) {
    committed_agents.insert(replicas[k].begin(), replicas[k].end());
  }
  for (const auto& a : everyone) {
    if (committed_agents.count(a)) continue;
    CallTarget<v1::AbortRequest> t{a, Endpoint(endpoints, a), {}};
    t.request.set_version(in_progress);
    t.request.set_reason(reason);
    aborts.push_back(std::move(t));
  }
  if (at_in_progress.empty()) {
    CallAll<v1::AbortRequest, v1::AbortResponse>(
        &channels_, aborts, std::chrono::milliseconds(5000),
        [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncAbort(c, q, cq); });
    found.push_back(absl::StrCat("step ", in_progress, " reached no replica: aborted everywhere"));
  } else {
    found.push_back(absl::StrCat("step ", in_progress, " committed on ", at_in_progress.size(),
                                 " replica(s) by the old leader's commit"));
  }
  return absl::StrJoin(found, ", ");
}

std::string ControllerCore::TakeOver(const v1::ControllerLedger& saved,
                                     Clock::time_point deadline) {
  RestoreLedger(saved);
  if (!saved.has_plan()) {
    return absl::StrCat("no plan in the ledger (last committed version ",
                        saved.last_committed_version(), "): the first Plan or Step plans");
  }
  // The warm standby usually holds every registration already; after a cold start, wait.
  const std::set<std::string> wanted(saved.plan_agents().begin(), saved.plan_agents().end());
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  const bool all_here = membership_.WaitFor(
      [&] {
        size_t alive = 0;
        for (const auto& a : membership_.Snapshot()) {
          alive += !a.lost && wanted.count(a.info.name()) ? 1 : 0;
        }
        return alive == wanted.size();
      },
      std::max(std::chrono::milliseconds(0), left));
  std::vector<std::string> notes;
  if (!all_here) notes.push_back("not every agent of the saved plan registered in time");
  auto world = RequestedWorld(saved.plan_request());
  auto planned = world.ok() ? PlanNow(saved.plan_request(), *world)
                            : absl::StatusOr<v1::PlanSummary>(world.status());
  if (!planned.ok()) {
    notes.push_back(
        absl::StrCat("planning again failed (the next step plans): ", planned.status().message()));
  } else {
    notes.push_back(absl::StrCat("planned again: hash ", planned->plan_hash(),
                                 planned->plan_hash() == saved.plan_hash()
                                     ? " (the same as the last leader's)"
                                     : absl::StrCat(" (the last leader's was ", saved.plan_hash(),
                                                    ": the layouts changed)")));
  }
  if (std::string versions = AdoptReceiverVersions(saved.step_in_progress()); !versions.empty()) {
    notes.push_back(versions);
  }
  PublishLedger();
  return absl::StrJoin(notes, "; ");
}

}  // namespace wb::controller
