// Calls the Agent service on many agents at once (gRPC callback API) and waits for all: the
// fan-out behind begin / execute / commit / abort and plan loading.
#pragma once

#include <grpcpp/grpcpp.h>

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
  }

  weightbeam::v1::Agent::Stub* Get(const std::string& endpoint) {
    absl::MutexLock lock(&mu_);
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
      stub = weightbeam::v1::Agent::NewStub(factory_.Create(endpoint, args));
    }
    return stub.get();
  }

 private:
  absl::Mutex mu_;
  wb::grpcutil::ChannelFactory factory_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<weightbeam::v1::Agent::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

// One target: agent name, its endpoint and the request to send it.
template <typename Req>
struct CallTarget {
  std::string agent;
  std::string endpoint;
  Req request;
};

// `start(stub, ctx, req, resp, done)` starts one async call, e.g.
//   [](auto* s, auto* c, auto* q, auto* r, auto d) { s->async()->Commit(c, q, r, d); }
template <typename Req, typename Resp, typename Start>
std::vector<CallResult<Resp>> CallAll(AgentChannels* channels,
                                      const std::vector<CallTarget<Req>>& targets,
                                      std::chrono::milliseconds timeout, Start start) {
  struct Pending {
    grpc::ClientContext ctx;
    Req request;
  };
  std::vector<CallResult<Resp>> results(targets.size());
  std::vector<std::unique_ptr<Pending>> pending;
  absl::Mutex mu;
  size_t left = targets.size();
  for (size_t i = 0; i < targets.size(); ++i) {
    auto p = std::make_unique<Pending>();
    p->ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    p->request = targets[i].request;
    results[i].agent = targets[i].agent;
    auto* stub = channels->Get(targets[i].endpoint);
    start(stub, &p->ctx, &p->request, &results[i].response,
          [&results, &mu, &left, i](grpc::Status s) {
            absl::MutexLock lock(&mu);
            results[i].status = std::move(s);
            --left;
          });
    pending.push_back(std::move(p));
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](size_t* n) { return *n == 0; }, &left));
  return results;
}

}  // namespace wb::controller
