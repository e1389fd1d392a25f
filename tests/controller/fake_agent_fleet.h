// An in-process AgentFleet for unit tests of the step protocol: every call of a fan-out runs on
// its own thread, as over gRPC; each agent answers per phase from a script (a delay, a status, a
// sender's report, a hook to block on or to start a race) and every call it received is logged.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/agent_fleet.h"

namespace wb::controller::testing {

enum class Phase { kBegin, kExecute, kCommit, kAbort, kHealth };

inline const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kBegin:
      return "begin";
    case Phase::kExecute:
      return "execute";
    case Phase::kCommit:
      return "commit";
    case Phase::kAbort:
      return "abort";
    case Phase::kHealth:
      return "health";
  }
  return "?";
}

// How one agent answers one phase.
struct Reply {
  std::chrono::milliseconds delay{0};  // a delay at or past the call's timeout: no answer
  grpc::Status status = grpc::Status::OK;
  std::optional<weightbeam::v1::AgentStepReport> report;  // execute: default ok, nothing sent
  std::function<void()> on_call;                          // runs first, on the call's thread
  std::function<grpc::Status()> answer;  // decides the status after the delay when set
  // health: the answer (default: serving, the step open)
  std::optional<weightbeam::v1::HealthResponse> health;
};

class FakeAgentFleet : public AgentFleet {
 public:
  void Script(const std::string& agent, Phase phase, Reply reply) {
    absl::MutexLock lock(&mu_);
    scripts_[{agent, phase}] = std::move(reply);
  }

  // What `agent` received, in arrival order: "begin 7", "execute 7", "commit 7", "abort 7"
  // (health checks are left out; see Received). A two-phase commit's rounds read "prepare 7"
  // and "announce 7".
  std::vector<std::string> Events(const std::string& agent) const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& e : log_) {
      if (e.agent == agent && e.phase != Phase::kHealth) {
        out.push_back(absl::StrCat(e.tag.empty() ? PhaseName(e.phase) : e.tag, " ", e.version));
      }
    }
    return out;
  }
  // What the watchers of `agent` saw, as a real agent tells them: "commit 7" when a commit that
  // is not a prepare succeeds (or an announce does), "abort 7" for every abort.
  std::vector<std::string> Watched(const std::string& agent) const {
    absl::MutexLock lock(&mu_);
    auto it = watched_.find(agent);
    return it == watched_.end() ? std::vector<std::string>() : it->second;
  }
  // Every execute request `agent` received, in order.
  std::vector<weightbeam::v1::ExecuteRequest> ExecuteRequestsOf(const std::string& agent) const {
    absl::MutexLock lock(&mu_);
    auto it = all_executes_.find(agent);
    return it == all_executes_.end() ? std::vector<weightbeam::v1::ExecuteRequest>() : it->second;
  }
  // Every call any agent received, in arrival order: "r0 begin", "s1 execute", ...
  std::vector<std::string> Log() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& e : log_) {
      out.push_back(absl::StrCat(e.agent, " ", e.tag.empty() ? PhaseName(e.phase) : e.tag));
    }
    return out;
  }
  bool Received(const std::string& agent, Phase phase) const {
    absl::MutexLock lock(&mu_);
    return ReceivedLocked(agent, phase);
  }
  // The reasons of the aborts `agent` received, in order.
  std::vector<std::string> AbortReasons(const std::string& agent) const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& e : log_) {
      if (e.agent == agent && e.phase == Phase::kAbort) out.push_back(e.reason);
    }
    return out;
  }
  // Blocks until `agent` received a `phase` call (at most 10 s); false on timeout.
  bool WaitFor(const std::string& agent, Phase phase) const {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ReceivedLocked(agent, phase); };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(10));
  }
  // The last request of that kind `agent` received, and the timeout its fan-out was given.
  weightbeam::v1::ExecuteRequest ExecuteRequestOf(const std::string& agent) const {
    absl::MutexLock lock(&mu_);
    return executes_.at(agent);
  }
  weightbeam::v1::CommitRequest CommitRequestOf(const std::string& agent) const {
    absl::MutexLock lock(&mu_);
    return commits_.at(agent);
  }
  std::chrono::milliseconds TimeoutOf(const std::string& agent, Phase phase) const {
    absl::MutexLock lock(&mu_);
    return timeouts_.at({agent, phase});
  }

  std::vector<CallResult<weightbeam::v1::BeginResponse>> Begin(
      const std::vector<AgentCall<weightbeam::v1::BeginRequest>>& calls,
      std::chrono::milliseconds timeout) override {
    return FanOut<weightbeam::v1::BeginRequest, weightbeam::v1::BeginResponse>(Phase::kBegin, calls,
                                                                               timeout);
  }
  std::vector<CallResult<weightbeam::v1::ExecuteResponse>> Execute(
      const std::vector<AgentCall<weightbeam::v1::ExecuteRequest>>& calls,
      std::chrono::milliseconds timeout) override {
    return FanOut<weightbeam::v1::ExecuteRequest, weightbeam::v1::ExecuteResponse>(Phase::kExecute,
                                                                                   calls, timeout);
  }
  std::vector<CallResult<weightbeam::v1::CommitResponse>> Commit(
      const std::vector<AgentCall<weightbeam::v1::CommitRequest>>& calls,
      std::chrono::milliseconds timeout) override {
    return FanOut<weightbeam::v1::CommitRequest, weightbeam::v1::CommitResponse>(Phase::kCommit,
                                                                                 calls, timeout);
  }
  std::vector<CallResult<weightbeam::v1::HealthResponse>> Health(
      const std::vector<AgentCall<weightbeam::v1::HealthRequest>>& calls,
      std::chrono::milliseconds timeout) override {
    return FanOut<weightbeam::v1::HealthRequest, weightbeam::v1::HealthResponse>(Phase::kHealth,
                                                                                 calls, timeout);
  }
  std::vector<CallResult<weightbeam::v1::AbortResponse>> Abort(
      const std::vector<AgentCall<weightbeam::v1::AbortRequest>>& calls,
      std::chrono::milliseconds timeout) override {
    return FanOut<weightbeam::v1::AbortRequest, weightbeam::v1::AbortResponse>(Phase::kAbort, calls,
                                                                               timeout);
  }

 private:
  struct Event {
    std::string agent;
    Phase phase;
    uint64_t version;
    std::string reason;  // aborts
    std::string tag;     // commits: "prepare" or "announce" (two-phase), else empty
  };

  bool ReceivedLocked(const std::string& agent, Phase phase) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& e : log_) {
      if (e.agent == agent && e.phase == phase) return true;
    }
    return false;
  }

  void Remember(const std::string& agent, const weightbeam::v1::BeginRequest& r, Event* e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {}
  void Remember(const std::string& agent, const weightbeam::v1::ExecuteRequest& r, Event* e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    executes_[agent] = r;
    all_executes_[agent].push_back(r);
  }
  void Remember(const std::string& agent, const weightbeam::v1::HealthRequest& r, Event* e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {}
  void Remember(const std::string& agent, const weightbeam::v1::CommitRequest& r, Event* e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    commits_[agent] = r;
    if (r.prepare()) e->tag = "prepare";
    if (r.announce()) e->tag = "announce";
  }
  void Remember(const std::string& agent, const weightbeam::v1::AbortRequest& r, Event* e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    e->reason = r.reason();
    if (r.receiving_only()) e->tag = "abort-receiving";  // its sending side goes on
  }

  static void Fill(const Reply& reply, weightbeam::v1::ExecuteResponse* resp) {
    if (reply.report) {
      *resp->mutable_report() = *reply.report;
    } else {
      resp->mutable_report()->set_ok(true);
    }
  }
  static void Fill(const Reply& reply, weightbeam::v1::HealthResponse* resp) {
    if (reply.health) {
      *resp = *reply.health;
      return;
    }
    resp->set_serving(true);
    resp->set_step_open(true);
  }
  template <typename Resp>
  static void Fill(const Reply&, Resp*) {}
  // What the agent tells its watchers once a call ended with `status`.
  void Tell(const std::string& agent, const weightbeam::v1::CommitRequest& r,
            const grpc::Status& status) {
    if (!status.ok() || r.prepare()) return;
    absl::MutexLock lock(&mu_);
    watched_[agent].push_back(absl::StrCat("commit ", r.version()));
  }
  void Tell(const std::string& agent, const weightbeam::v1::AbortRequest& r, const grpc::Status&) {
    absl::MutexLock lock(&mu_);
    watched_[agent].push_back(absl::StrCat("abort ", r.version()));
  }
  template <typename Req>
  void Tell(const std::string&, const Req&, const grpc::Status&) {}

  template <typename Req>
  static uint64_t VersionOf(const Req& r) {
    return r.version();
  }
  static uint64_t VersionOf(const weightbeam::v1::HealthRequest&) { return 0; }

  // Logs the call, then answers it as the script says.
  template <typename Req, typename Resp>
  void Answer(Phase phase, const AgentCall<Req>& call, std::chrono::milliseconds timeout,
              CallResult<Resp>* result) {
    result->agent = call.agent;
    Reply reply;
    {
      absl::MutexLock lock(&mu_);
      Event e{call.agent, phase, VersionOf(call.request), ""};
      Remember(call.agent, call.request, &e);
      log_.push_back(std::move(e));
      timeouts_[{call.agent, phase}] = timeout;
      auto it = scripts_.find({call.agent, phase});
      if (it != scripts_.end()) reply = it->second;
    }
    if (reply.on_call) reply.on_call();
    if (reply.delay >= timeout) {
      std::this_thread::sleep_for(timeout);
      result->status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
      return;
    }
    std::this_thread::sleep_for(reply.delay);
    result->status = reply.answer ? reply.answer() : reply.status;
    if (result->status.ok()) Fill(reply, &result->response);
    Tell(call.agent, call.request, result->status);
  }

  template <typename Req, typename Resp>
  std::vector<CallResult<Resp>> FanOut(Phase phase, const std::vector<AgentCall<Req>>& calls,
                                       std::chrono::milliseconds timeout) {
    std::vector<CallResult<Resp>> results(calls.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < calls.size(); ++i) {
      threads.emplace_back([this, phase, &calls, &results, timeout, i] {
        Answer(phase, calls[i], timeout, &results[i]);
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, Phase>, Reply> scripts_ ABSL_GUARDED_BY(mu_);
  std::vector<Event> log_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, weightbeam::v1::ExecuteRequest> executes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<weightbeam::v1::ExecuteRequest>> all_executes_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, weightbeam::v1::CommitRequest> commits_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::string>> watched_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, Phase>, std::chrono::milliseconds> timeouts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wb::controller::testing
