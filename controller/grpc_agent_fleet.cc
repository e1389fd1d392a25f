#include "controller/grpc_agent_fleet.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

namespace {
// A stream's answers in a link's terms: an agent without the stream did not get the command.
std::vector<StepLinks::Answer> ToLinkAnswers(std::vector<StepStreams::Answer> answers) {
  std::vector<StepLinks::Answer> out(answers.size());
  for (size_t i = 0; i < answers.size(); ++i) {
    out[i].status = std::move(answers[i].status);
    out[i].reply = std::move(answers[i].reply);
    out[i].not_sent = answers[i].unimplemented;
  }
  return out;
}
}  // namespace

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
  std::vector<bool> done(targets.size(), false);
  // Links first, then streams for what did not go on a link.
  for (const bool on_links : {true, false}) {
    if (on_links && !use_links_) continue;
    std::vector<size_t> sent;  // indexes into targets
    std::vector<std::string> endpoints;
    std::vector<v1::StepCommand> commands;
    for (size_t i = 0; i < targets.size(); ++i) {
      const std::string& e = targets[i].endpoint;
      if (done[i] || e.empty() || !(on_links ? links_.Links(e) : streams_.Streams(e))) continue;
      sent.push_back(i);
      endpoints.push_back(e);
      commands.emplace_back();
      put(targets[i].request, &commands.back());
    }
    if (sent.empty()) continue;
    auto answers = on_links ? links_.Send(endpoints, &commands, timeout)
                            : ToLinkAnswers(streams_.Send(endpoints, &commands, timeout));
    for (size_t k = 0; k < sent.size(); ++k) {
      StepLinks::Answer& a = answers[k];
      if (a.not_sent) continue;  // no link, or an older agent without the stream: next way
      const size_t i = sent[k];
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
