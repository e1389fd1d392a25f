#include "controller/step_protocol.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

// Begin and commit answer at once unless the agent stalls: 5 s, never past the step deadline
// (but at least 1 s, so a commit after a long transfer still gets its chance).
std::chrono::milliseconds QuickCallTimeout(const StepSpec& spec) {
  return std::clamp(Remaining(spec), std::chrono::milliseconds(1000),
                    std::chrono::milliseconds(5000));
}

std::string CallError(const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return "no answer before the deadline (agent stalled or overloaded)";
  }
  return s.error_message();
}

}  // namespace

absl::Status StepProtocol::Run(const StepSpec& spec, v1::StepResult* result) {
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
    inflight_agents_ = involved;
  }
  if (auto s = BeginOnReceivers(spec); !s.ok()) {
    AbortEverywhere(spec.version, involved, std::string(s.message()));
    return s;
  }
  result->set_delta_anchor(spec.anchor);
  if (auto s = ExecuteOnSenders(spec, result); !s.ok()) {
    AbortEverywhere(spec.version, involved, std::string(s.message()));
    return s;
  }
  return CommitOnReceivers(spec, result);
}

absl::Status StepProtocol::BeginOnReceivers(const StepSpec& spec) {
  std::vector<AgentCall<v1::BeginRequest>> calls;
  for (const auto& a : spec.receivers) {
    AgentCall<v1::BeginRequest> c{a, {}};
    c.request.set_version(spec.version);
    c.request.set_plan_id(spec.plan_id);
    calls.push_back(std::move(c));
  }
  for (const auto& r : fleet_->Begin(calls, QuickCallTimeout(spec))) {
    if (!r.status.ok()) {
      return absl::AbortedError(
          absl::StrCat("agent ", r.agent, ": begin failed: ", CallError(r.status)));
    }
  }
  return absl::OkStatus();
}

absl::Status StepProtocol::ExecuteOnSenders(const StepSpec& spec, v1::StepResult* result) {
  std::vector<AgentCall<v1::ExecuteRequest>> calls;
  for (const auto& a : spec.senders) {
    AgentCall<v1::ExecuteRequest> c{a, {}};
    c.request.set_version(spec.version);
    c.request.set_plan_id(spec.plan_id);
    c.request.set_timeout_ms(static_cast<uint32_t>(Remaining(spec).count()));
    c.request.set_delta_anchor(spec.anchor);
    c.request.set_step_nonce(spec.nonce);
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

absl::Status StepProtocol::CommitOnReceivers(const StepSpec& spec, v1::StepResult* result) {
  std::vector<AgentCall<v1::CommitRequest>> calls;
  for (const auto& a : spec.receivers) {
    AgentCall<v1::CommitRequest> c{a, {}};
    c.request.set_version(spec.version);
    c.request.set_step_nonce(spec.nonce);
    for (const auto& report : result->agents()) {
      for (const auto& h : report.hashes()) {
        if (h.dst_agent() == a) *c.request.add_expected_hashes() = h;
      }
    }
    calls.push_back(std::move(c));
  }
  // The hashes travelled to the receivers; the step result does not need them.
  for (auto& report : *result->mutable_agents()) report.clear_hashes();
  std::vector<std::string> errors;
  std::vector<std::string> failed;
  for (const auto& r : fleet_->Commit(calls, QuickCallTimeout(spec))) {
    if (!r.status.ok()) {
      errors.push_back(absl::StrCat("agent ", r.agent, ": commit failed: ", CallError(r.status)));
      failed.push_back(r.agent);
    }
  }
  if (errors.empty()) return absl::OkStatus();
  const std::string why = absl::StrJoin(errors, "; ");
  if (spec.delta) {
    // Senders drop their shadows; failed receivers tell their watchers.
    std::vector<std::string> to_abort = spec.senders;
    to_abort.insert(to_abort.end(), failed.begin(), failed.end());
    AbortEverywhere(spec.version, to_abort, why);
  }
  return absl::AbortedError(why);
}

void StepProtocol::AbortEverywhere(uint64_t version, const std::vector<std::string>& agents,
                                   const std::string& reason) {
  std::vector<AgentCall<v1::AbortRequest>> calls;
  for (const auto& a : agents) {
    AgentCall<v1::AbortRequest> c{a, {}};
    c.request.set_version(version);
    c.request.set_reason(reason);
    calls.push_back(std::move(c));
  }
  fleet_->Abort(calls, std::chrono::milliseconds(2000));
}

void StepProtocol::AbortInFlight(const std::string& reason) {
  uint64_t version;
  std::vector<std::string> agents;
  {
    absl::MutexLock lock(&mu_);
    version = inflight_version_;
    agents = inflight_agents_;
  }
  if (version == 0) return;
  spdlog::warn("aborting step {} in flight: {}", version, reason);
  AbortEverywhere(version, agents, reason);
}

}  // namespace wb::controller
