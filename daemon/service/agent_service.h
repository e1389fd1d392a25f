// The Agent gRPC service: a thin layer from RPCs to AgentNode; long calls (Execute, LoadPlan)
// run on a pool of reused threads so gRPC's callback threads never block.
#pragma once

#include "daemon/executor/worker_pool.h"
#include "daemon/service/agent_node.h"
#include "daemon/service/leader_fence.h"
#include "daemon/service/step_link_server.h"
#include "daemon/service/step_stream.h"
#include "security/call_guard.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::service {

class AgentService final : public weightbeam::v1::Agent::CallbackService {
 public:
  // `guard` admits calls: the token, the controller's certificate for controller calls, and a
  // certificate naming the calling agent for Handshake.
  explicit AgentService(AgentNode* node, security::CallGuard guard = {})
      : node_(node), guard_(std::move(guard)) {}

  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* ctx,
                                     const weightbeam::v1::DescribeRequest* req,
                                     weightbeam::v1::DescribeResponse* resp) override;
  grpc::ServerUnaryReactor* LoadPlan(grpc::CallbackServerContext* ctx,
                                     const weightbeam::v1::LoadPlanRequest* req,
                                     weightbeam::v1::LoadPlanResponse* resp) override;
  grpc::ServerUnaryReactor* Execute(grpc::CallbackServerContext* ctx,
                                    const weightbeam::v1::ExecuteRequest* req,
                                    weightbeam::v1::ExecuteResponse* resp) override;
  grpc::ServerUnaryReactor* Begin(grpc::CallbackServerContext* ctx,
                                  const weightbeam::v1::BeginRequest* req,
                                  weightbeam::v1::BeginResponse* resp) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* ctx,
                                   const weightbeam::v1::CommitRequest* req,
                                   weightbeam::v1::CommitResponse* resp) override;
  grpc::ServerUnaryReactor* RestoreVersion(grpc::CallbackServerContext* ctx,
                                           const weightbeam::v1::RestoreVersionRequest* req,
                                           weightbeam::v1::RestoreVersionResponse* resp) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx,
                                  const weightbeam::v1::AbortRequest* req,
                                  weightbeam::v1::AbortResponse* resp) override;
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* ctx,
                                   const weightbeam::v1::HealthRequest* req,
                                   weightbeam::v1::HealthResponse* resp) override;
  grpc::ServerUnaryReactor* Handshake(grpc::CallbackServerContext* ctx,
                                      const weightbeam::v1::HandshakeRequest* req,
                                      weightbeam::v1::HandshakeResponse* resp) override;
  grpc::ServerUnaryReactor* Introduce(grpc::CallbackServerContext* ctx,
                                      const weightbeam::v1::IntroduceRequest* req,
                                      weightbeam::v1::IntroduceResponse* resp) override;
  // The controller is admitted once per stream (token, controller certificate); every command
  // on it is then the controller's.
  grpc::ServerBidiReactor<weightbeam::v1::StepCommand, weightbeam::v1::StepReply>* StepStream(
      grpc::CallbackServerContext* ctx) override;

  // Hands out a step link's id and key (FAILED_PRECONDITION when step links are off).
  grpc::ServerUnaryReactor* OpenStepLink(grpc::CallbackServerContext* ctx,
                                         const weightbeam::v1::OpenStepLinkRequest* req,
                                         weightbeam::v1::OpenStepLinkResponse* resp) override;

  // Listens for step links; without this call OpenStepLink is refused.
  absl::Status StartStepLinks(const StepLinkOptions& options);
  // The step-link port (0 when off).
  uint16_t step_link_port() const { return step_links_ ? step_links_->port() : 0; }

  // Ends the open step streams and links (before the server shuts down: they never end by
  // themselves).
  void CloseStepChannels() {
    step_streams_.CloseAll();
    if (step_links_) step_links_->Stop();
  }

 private:
  // The guard's controller admission, then the leader-epoch fence (leader_fence.h).
  grpc::Status AdmitController(const grpc::ServerContextBase& ctx, const std::string& method);

  AgentNode* node_;
  security::CallGuard guard_;
  executor::WorkerPool long_calls_{2};
  OpenStepStreams step_streams_;                // after long_calls_: its commands run there
  std::unique_ptr<StepLinkServer> step_links_;  // the same
};

}  // namespace wb::service
