#include "controller/grpc_agent_fleet.h"

#include <algorithm>
#include <thread>

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
std::vector<CallResult<Resp>> GrpcAgentFleet::SendStepCommands(
    const std::vector<AgentCall<Req>>& calls, std::chrono::milliseconds timeout, Put put, Take take,
    Unary unary) {
  // Every way a command may take shares the fan-out's one deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  std::vector<CallTarget<Req>> targets = Targets(calls, false);
  std::vector<CallResult<Resp>> results(targets.size());
  if (!channels_->MayDrive()) {
    for (size_t i = 0; i < targets.size(); ++i) {
      results[i] = {targets[i].agent, AgentChannels::NotLeading(), {}};
    }
    return results;
  }
  const int64_t epoch = channels_->LeaderEpoch();
  std::vector<bool> done(targets.size(), false);
  struct Group {
    std::vector<size_t> at;  // indexes into targets
    std::vector<std::string> endpoints;
    std::vector<v1::StepCommand> commands;
  };
  auto add = [&](Group* g, size_t i) {
    g->at.push_back(i);
    g->endpoints.push_back(targets[i].endpoint);
    g->commands.emplace_back();
    g->commands.back().set_leader_epoch(epoch);
    put(targets[i].request, &g->commands.back());
  };
  auto record = [&](const Group& g, std::vector<StepAnswer>& answers) {
    for (size_t k = 0; k < g.at.size(); ++k) {
      StepAnswer& a = answers[k];
      if (a.not_sent) continue;  // no link after all, or an older agent without the stream
      const size_t i = g.at[k];
      results[i].agent = targets[i].agent;
      results[i].status = a.status;
      if (a.status.ok()) take(&a.reply, &results[i].response);
      done[i] = true;
    }
  };
  // Each command on its agent's link, else on its stream; agents without a link get one opened
  // for later steps, off this step's path.
  Group on_links, on_streams;
  std::vector<std::string> want_links;
  for (size_t i = 0; i < targets.size(); ++i) {
    const std::string& e = targets[i].endpoint;
    if (e.empty()) continue;
    if (use_links_ && links_.Has(e)) {
      add(&on_links, i);
      continue;
    }
    if (use_links_ && links_.Links(e)) want_links.push_back(e);
    if (streams_.Streams(e)) add(&on_streams, i);
  }
  if (!want_links.empty()) links_.Request(want_links);
  // Both ways at once when a fan-out needs both (a link being opened, an agent without links).
  std::vector<StepAnswer> link_answers, stream_answers;
  std::thread streamer;
  if (!on_streams.at.empty()) {
    auto run = [&] {
      stream_answers = streams_.Send(on_streams.endpoints, &on_streams.commands, left());
    };
    if (on_links.at.empty()) {
      run();
    } else {
      streamer = std::thread(run);
    }
  }
  if (!on_links.at.empty())
    link_answers = links_.Send(on_links.endpoints, &on_links.commands, left());
  if (streamer.joinable()) streamer.join();
  record(on_links, link_answers);
  record(on_streams, stream_answers);
  // A link that ended just before the fan-out: its command never left; the stream now.
  Group again;
  for (size_t i : on_links.at) {
    if (!done[i] && streams_.Streams(targets[i].endpoint)) add(&again, i);
  }
  if (!again.at.empty()) {
    auto answers = streams_.Send(again.endpoints, &again.commands, left());
    record(again, answers);
  }
  std::vector<CallTarget<Req>> rest;
  std::vector<size_t> rest_at;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (done[i]) continue;
    rest_at.push_back(i);
    rest.push_back(std::move(targets[i]));
  }
  if (rest.empty()) return results;
  auto unary_results = CallAll<Req, Resp>(channels_, rest, left(), unary);
  for (size_t k = 0; k < rest_at.size(); ++k) results[rest_at[k]] = std::move(unary_results[k]);
  return results;
}

std::vector<CallResult<v1::BeginResponse>> GrpcAgentFleet::Begin(
    const std::vector<AgentCall<v1::BeginRequest>>& calls, std::chrono::milliseconds timeout) {
  return SendStepCommands<v1::BeginRequest, v1::BeginResponse>(
      calls, timeout, [](const auto& req, v1::StepCommand* c) { *c->mutable_begin() = req; },
      [](v1::StepReply*, v1::BeginResponse*) {},
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncBegin(c, q, cq); });
}

std::vector<CallResult<v1::ExecuteResponse>> GrpcAgentFleet::Execute(
    const std::vector<AgentCall<v1::ExecuteRequest>>& calls, std::chrono::milliseconds timeout) {
  return SendStepCommands<v1::ExecuteRequest, v1::ExecuteResponse>(
      calls, timeout, [](const auto& req, v1::StepCommand* c) { *c->mutable_execute() = req; },
      [](v1::StepReply* r, v1::ExecuteResponse* resp) { resp->Swap(r->mutable_execute()); },
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncExecute(c, q, cq); });
}

std::vector<CallResult<v1::ExecuteResponse>> GrpcAgentFleet::Capture(
    const std::vector<AgentCall<v1::ExecuteRequest>>& calls, std::chrono::milliseconds timeout) {
  return CallAll<v1::ExecuteRequest, v1::ExecuteResponse>(
      channels_, Targets(calls, false), timeout,
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncExecute(c, q, cq); });
}

std::vector<CallResult<v1::CommitResponse>> GrpcAgentFleet::Commit(
    const std::vector<AgentCall<v1::CommitRequest>>& calls, std::chrono::milliseconds timeout) {
  return SendStepCommands<v1::CommitRequest, v1::CommitResponse>(
      calls, timeout, [](const auto& req, v1::StepCommand* c) { *c->mutable_commit() = req; },
      [](v1::StepReply* r, v1::CommitResponse* resp) { resp->Swap(r->mutable_commit()); },
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
