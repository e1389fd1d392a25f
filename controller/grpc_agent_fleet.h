// The AgentFleet the controller runs on: the Agent service over gRPC, every fan-out in parallel
// (CallAll), each agent's control endpoint looked up in the membership once per fan-out.
#pragma once

#include "controller/agent_calls.h"
#include "controller/agent_fleet.h"
#include "controller/membership.h"

namespace wb::controller {

class GrpcAgentFleet : public AgentFleet {
 public:
  // Both must outlive the fleet.
  GrpcAgentFleet(AgentChannels* channels, const Membership* membership)
      : channels_(channels), membership_(membership) {}

  std::vector<CallResult<weightbeam::v1::BeginResponse>> Begin(
      const std::vector<AgentCall<weightbeam::v1::BeginRequest>>& calls,
      std::chrono::milliseconds timeout) override;
  std::vector<CallResult<weightbeam::v1::ExecuteResponse>> Execute(
      const std::vector<AgentCall<weightbeam::v1::ExecuteRequest>>& calls,
      std::chrono::milliseconds timeout) override;
  std::vector<CallResult<weightbeam::v1::CommitResponse>> Commit(
      const std::vector<AgentCall<weightbeam::v1::CommitRequest>>& calls,
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

  AgentChannels* channels_;
  const Membership* membership_;
};

}  // namespace wb::controller
