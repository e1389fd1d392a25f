// One step's commit protocol over an AgentFleet, as named phases: begin on the receivers, execute
// on the senders (the barrier: every sender answers), commit on the receivers. A failure aborts
// the agents it may have touched and fails the step with an error naming the agent and the cause.
#pragma once

#include <chrono>
#include <cstdint>
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
  std::vector<std::string> senders;
  std::vector<std::string> receivers;
  // The step's deadline is `started + timeout`; every phase gets what is left of it.
  std::chrono::steady_clock::time_point started;
  std::chrono::milliseconds timeout{0};
  // Delta mode: whether this step is a dense anchor, and the nonce marking its receive slots.
  bool delta = false;
  bool anchor = false;
  uint64_t nonce = 0;
};

class StepProtocol {
 public:
  explicit StepProtocol(AgentFleet* fleet) : fleet_(fleet) {}

  // Runs the phases of one step. Adds the senders' reports, bytes and op counts to `result`
  // (and the delta anchor choice once begin succeeded). An error names the agent; by then the
  // agents involved were told to abort (after a commit failure: in delta mode only, the senders
  // and the receivers that failed). One step at a time.
  absl::Status Run(const StepSpec& spec, weightbeam::v1::StepResult* result);
  // Aborts the step in flight, if any, on every agent it involves (callable from any thread).
  void AbortInFlight(const std::string& reason);

  // The phases, in order.
  absl::Status BeginOnReceivers(const StepSpec& spec);
  absl::Status ExecuteOnSenders(const StepSpec& spec, weightbeam::v1::StepResult* result);
  absl::Status CommitOnReceivers(const StepSpec& spec, weightbeam::v1::StepResult* result);
  // Tells `agents` to abort `version` (best effort, 2 s).
  void AbortEverywhere(uint64_t version, const std::vector<std::string>& agents,
                       const std::string& reason);

 private:
  AgentFleet* fleet_;
  absl::Mutex mu_;
  // The step in flight (version 0: none) and the agents it involves, for AbortInFlight.
  uint64_t inflight_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> inflight_agents_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wb::controller
