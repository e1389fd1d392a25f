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

template <typename Req, typename Resp, typename Put, typename Take, typename Unary>
std::vector<CallResult<Resp>> GrpcAgentFleet::OnStreams(const std::vector<AgentCall<Req>>& calls,
                                                        std::chrono::milliseconds timeout, Put put,
                                                        Take take, Unary unary) {
  std::vector<CallTarget<Req>> targets = Targets(calls, false);
  std::vector<CallResult<Resp>> results(targets.size());
  std::vector<size_t> streamed;  // indexes into targets
  std::vector<std::string> endpoints;
  std::vector<v1::StepCommand> commands;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].endpoint.empty() || !streams_.Streams(targets[i].endpoint)) continue;
    streamed.push_back(i);
    endpoints.push_back(targets[i].endpoint);
    commands.emplace_back();
    put(targets[i].request, &commands.back());
  }
  std::vector<bool> done(targets.size(), false);
  if (!streamed.empty()) {
    std::vector<StepStreams::Answer> answers = streams_.Send(endpoints, &commands, timeout);
    for (size_t k = 0; k < streamed.size(); ++k) {
      StepStreams::Answer& a = answers[k];
      if (a.unimplemented) continue;  // an older agent: the unary call below
      const size_t i = streamed[k];
      results[i].agent = targets[i].agent;
      results[i].status = a.status;
      if (a.status.ok()) take(&a.reply, &results[i].response);
      done[i] = true;
    }
  }
  std::vector<CallTarget<Req>> rest;
  std::vector<size_t> rest_at;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (done[i]) continue;
    rest_at.push_back(i);
    rest.push_back(std::move(targets[i]));
  }
  if (rest.empty()) return results;
  auto unary_results = CallAll<Req, Resp>(channels_, rest, timeout, unary);
  for (size_t k = 0; k < rest_at.size(); ++k) results[rest_at[k]] = std::move(unary_results[k]);
  return results;
}

std::vector<CallResult<v1::BeginResponse>> GrpcAgentFleet::Begin(
    const std::vector<AgentCall<v1::BeginRequest>>& calls, std::chrono::milliseconds timeout) {
  return OnStreams<v1::BeginRequest, v1::BeginResponse>(
      calls, timeout, [](const auto& req, v1::StepCommand* c) { *c->mutable_begin() = req; },
      [](v1::StepReply*, v1::BeginResponse*) {},
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncBegin(c, q, cq); });
}

std::vector<CallResult<v1::ExecuteResponse>> GrpcAgentFleet::Execute(
    const std::vector<AgentCall<v1::ExecuteRequest>>& calls, std::chrono::milliseconds timeout) {
  return OnStreams<v1::ExecuteRequest, v1::ExecuteResponse>(
      calls, timeout, [](const auto& req, v1::StepCommand* c) { *c->mutable_execute() = req; },
      [](v1::StepReply* r, v1::ExecuteResponse* resp) { resp->Swap(r->mutable_execute()); },
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncExecute(c, q, cq); });
}

std::vector<CallResult<v1::CommitResponse>> GrpcAgentFleet::Commit(
    const std::vector<AgentCall<v1::CommitRequest>>& calls, std::chrono::milliseconds timeout) {
  return OnStreams<v1::CommitRequest, v1::CommitResponse>(
      calls, timeout, [](const auto& req, v1::StepCommand* c) { *c->mutable_commit() = req; },
      [](v1::StepReply*, v1::CommitResponse*) {},
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
