// The AgentFleet the controller runs on: the Agent service over gRPC, every fan-out in parallel,
// each agent's control endpoint looked up in the membership once per fan-out. Begin, execute
// and commit go on each agent's step link (StepLinks), else on its gRPC step stream
// (StepStreams); the rest, and agents with neither, are unary calls (CallAll).
#pragma once

#include "controller/agent_calls.h"
#include "controller/agent_fleet.h"
#include "controller/membership.h"
#include "controller/step_links.h"
#include "controller/step_streams.h"

namespace wb::controller {

class GrpcAgentFleet : public AgentFleet {
 public:
  // Both must outlive the fleet.
  // `step_links`: try step links first (the controller's `step_links` setting).
  GrpcAgentFleet(AgentChannels* channels, const Membership* membership, bool step_links = true)
      : channels_(channels),
        membership_(membership),
        use_links_(step_links),
        links_(channels),
        streams_(channels) {
    channels_->SetResetListener([this](const std::string& endpoint) {
      links_.Reset(endpoint);
      streams_.Reset(endpoint);
    });
  }
  ~GrpcAgentFleet() override { channels_->SetResetListener(nullptr); }

  std::vector<CallResult<weightbeam::v1::BeginResponse>> Begin(
      const std::vector<AgentCall<weightbeam::v1::BeginRequest>>& calls,
      std::chrono::milliseconds timeout) override;
  std::vector<CallResult<weightbeam::v1::ExecuteResponse>> Execute(
      const std::vector<AgentCall<weightbeam::v1::ExecuteRequest>>& calls,
      std::chrono::milliseconds timeout) override;
  // Plain unary calls: a step link or stream carries one fan-out at a time.
  std::vector<CallResult<weightbeam::v1::ExecuteResponse>> Capture(
      const std::vector<AgentCall<weightbeam::v1::ExecuteRequest>>& calls,
      std::chrono::milliseconds timeout) override;
  std::vector<CallResult<weightbeam::v1::CommitResponse>> Commit(
      const std::vector<AgentCall<weightbeam::v1::CommitRequest>>& calls,
      std::chrono::milliseconds timeout) override;
  std::vector<CallResult<weightbeam::v1::HealthResponse>> Health(
      const std::vector<AgentCall<weightbeam::v1::HealthRequest>>& calls,
      std::chrono::milliseconds timeout) override;
  // Skips agents without a known endpoint.
  std::vector<CallResult<weightbeam::v1::AbortResponse>> Abort(
      const std::vector<AgentCall<weightbeam::v1::AbortRequest>>& calls,
      std::chrono::milliseconds timeout) override;

 private:
  // One name -> endpoint table per fan-out (a copy of the membership with its layouts per agent
  // per call made a step O(agents^2)). An unknown agent gets "" (its call fails) unless
  // `skip_unknown`.
  template <typename Req>
  std::vector<CallTarget<Req>> Targets(const std::vector<AgentCall<Req>>& calls,
                                       bool skip_unknown) const;

  // Each command on its agent's step link, else on its stream, in target order; the agents
  // with neither (and unknown agents) get the unary call `unary` instead. `put(request, command)`
  // fills the command, `take(reply)` the response.
  template <typename Req, typename Resp, typename Put, typename Take, typename Unary>
  std::vector<CallResult<Resp>> SendStepCommands(const std::vector<AgentCall<Req>>& calls,
                                                 std::chrono::milliseconds timeout, Put put,
                                                 Take take, Unary unary);

  AgentChannels* channels_;
  const Membership* membership_;
  const bool use_links_;
  StepLinks links_;
  StepStreams streams_;
};

}  // namespace wb::controller
