// The training loop's handle on the controller: plan once, then Step(version) after every
// optimizer step; plus the status queries wbctl uses.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "weightbeam/v1/controller.pb.h"

namespace wb::client {

class ControllerClient {
 public:
  // `address` is host:port; nothing is sent until the first call.
  static absl::StatusOr<ControllerClient> Connect(const std::string& address);
  ControllerClient(ControllerClient&&) noexcept;
  ControllerClient& operator=(ControllerClient&&) noexcept;
  ~ControllerClient();

  // Waits (up to `wait`) until the world is complete, plans, loads the plan on the senders.
  absl::StatusOr<weightbeam::v1::PlanSummary> Plan(const weightbeam::v1::ExpectedWorld& world,
                                                   std::chrono::milliseconds wait);
  // Pushes version `version` to the inference side; a failed step is an error whose message
  // names the agent and cause. `timeout` 0 uses the controller's configured step timeout.
  // The call itself gives up (DEADLINE_EXCEEDED) 60 s after `timeout`, or after 15 minutes
  // when `timeout` is 0, should the controller stall.
  absl::StatusOr<weightbeam::v1::StepResult> Step(uint64_t version,
                                                  std::chrono::milliseconds timeout = {});
  absl::StatusOr<weightbeam::v1::StatusResponse> Status();
  absl::StatusOr<weightbeam::v1::ListTensorsResponse> ListTensors(const std::string& agent);
  // Calls `on_step` for every step result until it returns false or the stream ends.
  absl::Status WatchSteps(const std::function<bool(const weightbeam::v1::StepResult&)>& on_step);

 private:
  struct Impl;
  explicit ControllerClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wb::client
