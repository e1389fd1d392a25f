// The training loop's handle on the controller: plan once, then Step(version) after every
// optimizer step; plus the status queries wbctl uses.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "weightbeam/v1/controller.pb.h"

namespace wb::client {

class ControllerClient {
 public:
  // How to reach a controller that uses TLS and/or a call token. Empty: plain, no token.
  struct Security {
    std::string ca_file;      // verifies the controller's certificate (TLS when set)
    std::string cert_file;    // our certificate, for a controller that requires one
    std::string key_file;     // its private key
    std::string token_file;   // the shared token, sent as `authorization: Bearer <token>`
    std::string server_name;  // expected name in the controller's certificate (default: host)
    // From $WB_TLS_CA, $WB_TLS_CERT, $WB_TLS_KEY, $WB_TOKEN_FILE, $WB_TLS_SERVER_NAME.
    static Security FromEnvironment();
  };

  // `address` is host:port; nothing is sent until the first call. Security comes from the
  // environment (see Security::FromEnvironment). Controllers in high availability (`ha:`,
  // docs/reliability.md): "a:7100,b:7100", every one; calls go to the leader, and a standby's
  // answer or a controller that stops answering moves them on to the next (a step within its
  // timeout, other calls within 60 s). A step retried after a failover that finds its version
  // committed already answers with that result, `already_committed` set.
  static absl::StatusOr<ControllerClient> Connect(const std::string& address);
  // Fails when a file in `security` cannot be read (the message names the file).
  static absl::StatusOr<ControllerClient> Connect(const std::string& address,
                                                  const Security& security);
  ControllerClient(ControllerClient&&) noexcept;
  ControllerClient& operator=(ControllerClient&&) noexcept;
  ~ControllerClient();

  // Waits (up to `wait`) until the world is complete, plans, loads the plan on the senders.
  // `delta`: delta mode for this plan and later ones (default: the controller's config).
  // `checks`: what every version of the plan is checked for on its receivers before commit.
  absl::StatusOr<weightbeam::v1::PlanSummary> Plan(
      const weightbeam::v1::ExpectedWorld& world, std::chrono::milliseconds wait,
      weightbeam::v1::DeltaChoice delta = weightbeam::v1::DELTA_CHOICE_CONFIG,
      weightbeam::v1::RelayChoice relays = weightbeam::v1::RELAY_CHOICE_CONFIG,
      const weightbeam::v1::VersionChecks& checks = {});
  // Pushes version `version` to the inference side; a failed step is an error whose message
  // names the agent and cause. `timeout` 0 uses the controller's configured step timeout.
  // The call itself gives up (DEADLINE_EXCEEDED) 60 s after `timeout`, or after 15 minutes
  // when `timeout` is 0, should the controller stall.
  // `max_staleness` (docs/elastic.md): the step first waits, within `timeout`, until no
  // inference replica left out of it would be more than that many versions behind.
  // `changed`: a partial step's changed tensor patterns (StepRequest.changed; empty: all).
  absl::StatusOr<weightbeam::v1::StepResult> Step(
      uint64_t version, std::chrono::milliseconds timeout = {},
      std::optional<uint32_t> max_staleness = std::nullopt,
      const std::vector<std::string>& changed = {});
  // Every replica in `replicas` (empty: all) live at kept version `to` again, with one local
  // copy per agent (receive.keep_versions); an error names the agent and what it keeps.
  absl::StatusOr<weightbeam::v1::StepResult> Rollback(uint64_t to,
                                                      const std::vector<int32_t>& replicas = {});
  // The same step, answering twice (Controller.StepAsync, docs/clients.md): WaitCaptured
  // returns once every sender has captured the version (the trainer may change its weights
  // from then on; before, doing so is the caller's bug), Result with the step's result. A step
  // that failed is an error (ABORTED, naming the agent and cause) from both; a wait that runs
  // out is DEADLINE_EXCEEDED. Dropping the handle before the result cancels the call only:
  // the step goes on in the controller. With several controllers, a leader that goes before
  // every sender captured is left for the new one (the step starts there again, as a retry);
  // after the capture it is not (the trainer may hold newer weights already): an error.
  class StepHandle {
   public:
    StepHandle(StepHandle&&) noexcept;
    StepHandle& operator=(StepHandle&&) noexcept;
    StepHandle(const StepHandle&) = delete;
    StepHandle& operator=(const StepHandle&) = delete;
    ~StepHandle();
    absl::StatusOr<weightbeam::v1::StepCaptured> WaitCaptured(std::chrono::milliseconds timeout);
    absl::StatusOr<weightbeam::v1::StepResult> Result(std::chrono::milliseconds timeout);
    // For callers that hold handles by pointer: `h->Result(...)` reads the same as `h.Result`.
    StepHandle* operator->() { return this; }

   private:
    friend class ControllerClient;
    struct State;
    StepHandle();
    std::shared_ptr<State> state_;
  };
  // Never fails here: an unreachable controller or a refused call is the handle's error.
  StepHandle StepAsync(uint64_t version, std::chrono::milliseconds timeout = {},
                       std::optional<uint32_t> max_staleness = std::nullopt);
  // With several controllers: the leader's status (else a standby's, naming the leader).
  absl::StatusOr<weightbeam::v1::StatusResponse> Status();
  // The controller calls go to now (the one that answered last).
  std::string leader() const;
  absl::StatusOr<weightbeam::v1::ListTensorsResponse> ListTensors(const std::string& agent);
  // Calls `on_step` for every step result until it returns false or the stream ends.
  absl::Status WatchSteps(const std::function<bool(const weightbeam::v1::StepResult&)>& on_step);

 private:
  struct Impl;
  explicit ControllerClient(std::unique_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with StepAsync's readers (they follow the leader too)
};

}  // namespace wb::client
