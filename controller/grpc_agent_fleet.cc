#include "controller/grpc_agent_fleet.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

template <typename Req>
std::vector<CallTarget<Req>> GrpcAgentFleet::Targets(const std::vector<AgentCall<Req>>& calls,
                                                     bool skip_unknown) const {
  const auto endpoints = membership_->Endpoints();
  std::vector<CallTarget<Req>> targets;
  targets.reserve(calls.size());
  for (const auto& c : calls) {
    auto it = endpoints.find(c.agent);
    std::string endpoint = it == endpoints.end() ? "" : it->second;
    if (endpoint.empty() && skip_unknown) continue;
    targets.push_back({c.agent, std::move(endpoint), c.request});
  }
  return targets;
}

std::vector<CallResult<v1::BeginResponse>> GrpcAgentFleet::Begin(
    const std::vector<AgentCall<v1::BeginRequest>>& calls, std::chrono::milliseconds timeout) {
  return CallAll<v1::BeginRequest, v1::BeginResponse>(
      channels_, Targets(calls, false), timeout,
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncBegin(c, q, cq); });
}

std::vector<CallResult<v1::ExecuteResponse>> GrpcAgentFleet::Execute(
    const std::vector<AgentCall<v1::ExecuteRequest>>& calls, std::chrono::milliseconds timeout) {
  return CallAll<v1::ExecuteRequest, v1::ExecuteResponse>(
      channels_, Targets(calls, false), timeout,
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncExecute(c, q, cq); });
}

std::vector<CallResult<v1::CommitResponse>> GrpcAgentFleet::Commit(
    const std::vector<AgentCall<v1::CommitRequest>>& calls, std::chrono::milliseconds timeout) {
  return CallAll<v1::CommitRequest, v1::CommitResponse>(
      channels_, Targets(calls, false), timeout,
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncCommit(c, q, cq); });
}

std::vector<CallResult<v1::HealthResponse>> GrpcAgentFleet::Health(
    const std::vector<AgentCall<v1::HealthRequest>>& calls, std::chrono::milliseconds timeout) {
  return CallAll<v1::HealthRequest, v1::HealthResponse>(
      channels_, Targets(calls, false), timeout,
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncHealth(c, q, cq); });
}

std::vector<CallResult<v1::AbortResponse>> GrpcAgentFleet::Abort(
    const std::vector<AgentCall<v1::AbortRequest>>& calls, std::chrono::milliseconds timeout) {
  return CallAll<v1::AbortRequest, v1::AbortResponse>(
      channels_, Targets(calls, true), timeout,
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncAbort(c, q, cq); });
}

}  // namespace wb::controller
