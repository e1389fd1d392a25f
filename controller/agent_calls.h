// Calls the Agent service on many agents at once (one completion queue driven by the calling
// thread) and waits for all: the fan-out behind begin / execute / commit / abort and plan loading.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/grpc/credentials.h"
#include "common/grpc/message_limits.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::controller {

template <typename Resp>
struct CallResult {
  std::string agent;
  grpc::Status status;
  Resp response;
};

// "agent A: why; agent B: why" for the calls that failed; empty when all succeeded.
template <typename Resp>
std::string FailedCalls(const std::vector<CallResult<Resp>>& results) {
  std::string out;
  for (const auto& r : results) {
    if (r.status.ok()) continue;
    if (!out.empty()) out += "; ";
    out += "agent " + r.agent + ": " + r.status.error_message();
  }
  return out;
}

// Channels to agents, by control endpoint, reused across calls.
class AgentChannels {
 public:
  // TLS and token for channels made from now on (default: insecure, no token).
  void SetFactory(wb::grpcutil::ChannelFactory factory) {
    absl::MutexLock lock(&mu_);
    factory_ = std::move(factory);
    stubs_.clear();
    channels_.clear();
  }

  // The agent at `endpoint` just registered (a restart, or back after a loss): a channel still
  // in reconnect backoff from its old process would fail the next calls at once ("failed to
  // connect") for up to the backoff; connect again now instead.
  void ResetBackoff(const std::string& endpoint) {
    std::function<void(const std::string&)> on_reset;
    {
      absl::MutexLock lock(&mu_);
      auto it = channels_.find(endpoint);
      if (it != channels_.end()) {
        grpc::experimental::ChannelResetConnectionBackoff(it->second.get());
      }
      on_reset = on_reset_;
    }
    if (on_reset) on_reset(endpoint);
  }
  // Also tells `on_reset` (the step streams: the agent there may be a newer build now).
  void SetResetListener(std::function<void(const std::string&)> on_reset) {
    absl::MutexLock lock(&mu_);
    on_reset_ = std::move(on_reset);
  }

  weightbeam::v1::Agent::Stub* Get(const std::string& endpoint) {
    absl::MutexLock lock(&mu_);
    return GetLocked(endpoint);
  }
  // The leader epoch (issue 45) every call to an agent carries from now on, as the metadata
  // agents fence by (daemon/service/leader_fence.h); 0 (a controller without high
  // availability): none.
  void SetLeaderEpoch(int64_t epoch) { leader_epoch_.store(epoch); }
  // The epoch as the metadata's value ("" : none).
  std::string LeaderEpochText() const {
    const int64_t e = leader_epoch_.load();
    return e > 0 ? std::to_string(e) : std::string();
  }
  int64_t LeaderEpoch() const { return leader_epoch_.load(); }
  // With high availability: whether this controller still leads (its lease certainly alive).
  // While it does not, no call and no step command leaves it (CallAll, step fan-outs), even
  // from a step that began while it led: a leader frozen past its lease wakes up deposed.
  void SetLeaderCheck(std::function<bool()> leading) {
    absl::MutexLock lock(&mu_);
    leading_ = std::move(leading);
  }
  bool MayDrive() {
    absl::MutexLock lock(&mu_);
    return !leading_ || leading_();
  }
  static grpc::Status NotLeading() {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this controller is not the leader (its lease was lost or taken over): "
                        "it drives no agent");
  }
  // Puts the leader epoch on a call about to be made.
  void Stamp(grpc::ClientContext* ctx) const {
    if (std::string e = LeaderEpochText(); !e.empty()) ctx->AddMetadata("wb-leader-epoch", e);
  }
  // One stub per endpoint, in order, under one lock (a fan-out to hundreds of agents).
  std::vector<weightbeam::v1::Agent::Stub*> Get(const std::vector<std::string>& endpoints) {
    std::vector<weightbeam::v1::Agent::Stub*> out;
    out.reserve(endpoints.size());
    absl::MutexLock lock(&mu_);
    for (const auto& e : endpoints) out.push_back(GetLocked(e));
    return out;
  }

 private:
  weightbeam::v1::Agent::Stub* GetLocked(const std::string& endpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto& stub = stubs_[endpoint];
    if (!stub) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(kMaxControlMessageBytes);  // Describe of 10^6 tensors
      args.SetMaxSendMessageSize(kMaxControlMessageBytes);     // plans with millions of ops
      // An agent that was down for minutes and restarts on the same endpoint must be reachable
      // at once: gRPC's default reconnect backoff grows to 120 s, during which every call to
      // it fails fast ("failed to connect") and each step re-plans without it.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // Per-call bookkeeping nobody reads (a few % of the controller's CPU with 512 agents).
      args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
      auto channel = factory_.Create(endpoint, args);
      channels_[endpoint] = channel;
      stub = weightbeam::v1::Agent::NewStub(channel);
    }
    return stub.get();
  }

  std::atomic<int64_t> leader_epoch_{0};
  absl::Mutex mu_;
  wb::grpcutil::ChannelFactory factory_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<weightbeam::v1::Agent::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_reset_ ABSL_GUARDED_BY(mu_);
  std::function<bool()> leading_ ABSL_GUARDED_BY(mu_);
};

// One target: agent name, its endpoint and the request to send it.
template <typename Req>
struct CallTarget {
  std::string agent;
  std::string endpoint;
  Req request;
};

// Sends every call at once and returns every answer in target order, each call ending by
// `timeout` (DEADLINE_EXCEEDED for an agent that does not answer). The calling thread drives one
// completion queue itself: no thread per call, no hand-off to gRPC's callback threads, one wake-up
// per answer. `prepare(stub, ctx, request, cq)` makes one call, e.g.
//   [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncCommit(c, q, cq); }
// Requests are sent from `targets` as they are (no copy).
template <typename Req, typename Resp, typename Prepare>
std::vector<CallResult<Resp>> CallAll(AgentChannels* channels,
                                      const std::vector<CallTarget<Req>>& targets,
                                      std::chrono::milliseconds timeout, Prepare prepare) {
  const size_t n = targets.size();
  std::vector<CallResult<Resp>> results(n);
  if (n == 0) return results;
  if (!channels->MayDrive()) {
    for (size_t i = 0; i < n; ++i) results[i] = {targets[i].agent, AgentChannels::NotLeading(), {}};
    return results;
  }
  std::vector<std::string> endpoints;
  endpoints.reserve(n);
  for (const auto& t : targets) endpoints.push_back(t.endpoint);
  const std::vector<weightbeam::v1::Agent::Stub*> stubs = channels->Get(endpoints);
  grpc::CompletionQueue cq;
  const std::string epoch = channels->LeaderEpochText();
  // ClientContext is neither copyable nor movable: one array, alive until every call ended.
  std::unique_ptr<grpc::ClientContext[]> contexts(new grpc::ClientContext[n]);
  std::vector<std::unique_ptr<grpc::ClientAsyncResponseReader<Resp>>> readers(n);
  const auto deadline = std::chrono::system_clock::now() + timeout;
  for (size_t i = 0; i < n; ++i) {
    results[i].agent = targets[i].agent;
    contexts[i].set_deadline(deadline);
    if (!epoch.empty()) contexts[i].AddMetadata("wb-leader-epoch", epoch);
    readers[i] = prepare(stubs[i], &contexts[i], targets[i].request, &cq);
    readers[i]->StartCall();
    readers[i]->Finish(&results[i].response, &results[i].status, reinterpret_cast<void*>(i));
  }
  // Every Finish comes back exactly once (by its deadline at the latest).
  void* tag = nullptr;
  bool ok = false;
  for (size_t left = n; left > 0 && cq.Next(&tag, &ok); --left) {
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return results;
}

}  // namespace wb::controller
