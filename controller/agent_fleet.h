// The per-agent calls the step protocol makes (begin, execute, commit, abort), each fanned out to
// many agents at once and answered per agent. The controller runs over GrpcAgentFleet; unit
// tests run the protocol over an in-process fake to produce orderings on demand.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <vector>

#include "controller/agent_calls.h"
#include "weightbeam/v1/agent.pb.h"

namespace wb::controller {

// One call: the agent it goes to, by name, and what to send it.
template <typename Req>
struct AgentCall {
  std::string agent;
  Req request;
};

class AgentFleet {
 public:
  virtual ~AgentFleet() = default;

  // Each sends every call at once and returns when all have answered or timed out after
  // `timeout` (a grpc::Status per agent, DEADLINE_EXCEEDED for no answer), in call order.
  virtual std::vector<CallResult<weightbeam::v1::BeginResponse>> Begin(
      const std::vector<AgentCall<weightbeam::v1::BeginRequest>>& calls,
      std::chrono::milliseconds timeout) = 0;
  virtual std::vector<CallResult<weightbeam::v1::ExecuteResponse>> Execute(
      const std::vector<AgentCall<weightbeam::v1::ExecuteRequest>>& calls,
      std::chrono::milliseconds timeout) = 0;
  // Capture steps: the capture_only executes, which may run while another step's execute is
  // still out on the same agents (so never queued behind it on a step link or stream).
  virtual std::vector<CallResult<weightbeam::v1::ExecuteResponse>> Capture(
      const std::vector<AgentCall<weightbeam::v1::ExecuteRequest>>& calls,
      std::chrono::milliseconds timeout) {
    return Execute(calls, timeout);
  }
  virtual std::vector<CallResult<weightbeam::v1::CommitResponse>> Commit(
      const std::vector<AgentCall<weightbeam::v1::CommitRequest>>& calls,
      std::chrono::milliseconds timeout) = 0;
  // Agent.Health: the commit policy asks receivers whether they are there after a sender failed.
  virtual std::vector<CallResult<weightbeam::v1::HealthResponse>> Health(
      const std::vector<AgentCall<weightbeam::v1::HealthRequest>>& calls,
      std::chrono::milliseconds timeout) = 0;
  // Best effort: agents the fleet cannot reach are skipped.
  virtual std::vector<CallResult<weightbeam::v1::AbortResponse>> Abort(
      const std::vector<AgentCall<weightbeam::v1::AbortRequest>>& calls,
      std::chrono::milliseconds timeout) = 0;
};

}  // namespace wb::controller
