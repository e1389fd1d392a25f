#include "daemon/service/agent_service.h"

#include "common/grpc/status_util.h"
#include "common/process/malloc_arenas.h"
#include "daemon/service/step_commands.h"
#include "daemon/service/step_stream.h"

namespace wb::service {

namespace v1 = weightbeam::v1;

namespace {
grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  auto* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const grpc::Status& s) {
  auto* r = ctx->DefaultReactor();
  r->Finish(s);
  return r;
}
}  // namespace

grpc::Status AgentService::AdmitController(const grpc::ServerContextBase& ctx,
                                           const std::string& method) {
  if (grpc::Status a = guard_.AdmitController(ctx, method); !a.ok()) return a;
  return node_->leader_fence().Admit(ctx, method);
}

grpc::ServerUnaryReactor* AgentService::Describe(grpc::CallbackServerContext* ctx,
                                                 const v1::DescribeRequest* req,
                                                 v1::DescribeResponse* resp) {
  if (auto a = AdmitController(*ctx, "Agent.Describe"); !a.ok()) return Refuse(ctx, a);
  *resp->mutable_agent() = node_->Info();
  const uint64_t generation = node_->LayoutGeneration();
  if (req->known_generation() != 0 && req->known_generation() == generation) {
    // The caller has this layout already: skip building and sending 10^6 entries.
    resp->mutable_layout()->set_agent(resp->agent().name());
    resp->mutable_layout()->set_generation(generation);
    resp->set_layout_unchanged(true);
    return Done(ctx, absl::OkStatus());
  }
  *resp->mutable_layout() = node_->Layout();
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AgentService::LoadPlan(grpc::CallbackServerContext* ctx,
                                                 const v1::LoadPlanRequest* req,
                                                 v1::LoadPlanResponse* resp) {
  if (auto a = AdmitController(*ctx, "Agent.LoadPlan"); !a.ok()) return Refuse(ctx, a);
  // Connecting to peers runs handshakes over gRPC: do it off the callback thread.
  auto* reactor = ctx->DefaultReactor();
  // The request is ours until Finish: its plan moves into the node instead of being copied.
  auto* plan = const_cast<v1::LoadPlanRequest*>(req)->mutable_plan();
  long_calls_.Submit([this, reactor, plan, resp] {
    const absl::Status s = node_->LoadPlan(std::move(*plan), resp);
    ReturnFreeMemory();  // the previous plan, and the copies made while parsing this one
    reactor->Finish(ToGrpc(s));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AgentService::Execute(grpc::CallbackServerContext* ctx,
                                                const v1::ExecuteRequest* req,
                                                v1::ExecuteResponse* resp) {
  if (auto a = AdmitController(*ctx, "Agent.Execute"); !a.ok()) return Refuse(ctx, a);
  auto* reactor = ctx->DefaultReactor();
  long_calls_.Submit([this, reactor, req, resp] {
    *resp->mutable_report() = node_->Execute(*req);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* AgentService::Begin(grpc::CallbackServerContext* ctx,
                                              const v1::BeginRequest* req, v1::BeginResponse*) {
  if (auto a = AdmitController(*ctx, "Agent.Begin"); !a.ok()) return Refuse(ctx, a);
  return Done(ctx, node_->BeginStep(req->version(), req->step_id(), req->plan_id()));
}

grpc::ServerUnaryReactor* AgentService::Commit(grpc::CallbackServerContext* ctx,
                                               const v1::CommitRequest* req,
                                               v1::CommitResponse* resp) {
  if (auto a = AdmitController(*ctx, "Agent.Commit"); !a.ok()) return Refuse(ctx, a);
  const bool delta = req->step_nonce() != 0 && !req->announce();
  if (!node_->CommitMayWait(*req)) return Done(ctx, node_->CommitStep(*req, resp));
  // Delta mode (applying the deltas) and staged swaps (waiting for watchers) take a while:
  // off the callback thread.
  auto* reactor = ctx->DefaultReactor();
  long_calls_.Submit([this, reactor, req, resp, delta] {
    reactor->Finish(ToGrpc(delta ? node_->Commit(*req, resp) : node_->CommitStep(*req, resp)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* AgentService::Abort(grpc::CallbackServerContext* ctx,
                                              const v1::AbortRequest* req,
                                              v1::AbortResponse* resp) {
  if (auto a = AdmitController(*ctx, "Agent.Abort"); !a.ok()) return Refuse(ctx, a);
  bool already_committed = false;
  const absl::Status s = node_->Abort(req->version(), req->reason(), req->step_id(),
                                      req->receiving_only(), &already_committed);
  resp->set_already_committed(already_committed);
  return Done(ctx, s);
}

grpc::ServerUnaryReactor* AgentService::RestoreVersion(grpc::CallbackServerContext* ctx,
                                                       const v1::RestoreVersionRequest* req,
                                                       v1::RestoreVersionResponse* resp) {
  if (auto a = AdmitController(*ctx, "Agent.RestoreVersion"); !a.ok()) return Refuse(ctx, a);
  return Done(ctx, node_->Rollback(*req, resp));
}

grpc::ServerUnaryReactor* AgentService::Health(grpc::CallbackServerContext* ctx,
                                               const v1::HealthRequest* req,
                                               v1::HealthResponse* resp) {
  if (grpc::Status admitted = guard_.Admit(*ctx); !admitted.ok()) return Refuse(ctx, admitted);
  *resp = node_->Health(req->step_id());
  return Done(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AgentService::Handshake(grpc::CallbackServerContext* ctx,
                                                  const v1::HandshakeRequest* req,
                                                  v1::HandshakeResponse* resp) {
  // With client certificates, an agent hands over its records under its own name only.
  if (grpc::Status admitted = guard_.AdmitIdentity(*ctx, req->from_agent(), "Agent.Handshake");
      !admitted.ok()) {
    return Refuse(ctx, admitted);
  }
  auto record = node_->Handshake(*req);
  if (record.ok()) resp->set_record(*record);
  return Done(ctx, record.status());
}

grpc::ServerUnaryReactor* AgentService::Introduce(grpc::CallbackServerContext* ctx,
                                                  const v1::IntroduceRequest* req,
                                                  v1::IntroduceResponse*) {
  if (auto a = AdmitController(*ctx, "Agent.Introduce"); !a.ok()) return Refuse(ctx, a);
  return Done(ctx,
              node_->Introduce(req->plan_id(), {req->senders().begin(), req->senders().end()}));
}

grpc::ServerBidiReactor<v1::StepCommand, v1::StepReply>* AgentService::StepStream(
    grpc::CallbackServerContext* ctx) {
  if (auto a = AdmitController(*ctx, "Agent.StepStream"); !a.ok()) {
    return new security::RefusedStream<v1::StepCommand, v1::StepReply>(a);
  }
  if (step_streams_.closed()) {
    return new security::RefusedStream<v1::StepCommand, v1::StepReply>(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "agent shutting down"));
  }
  return new StepStreamReactor(node_, &long_calls_, &step_streams_);
}

grpc::ServerUnaryReactor* AgentService::OpenStepLink(grpc::CallbackServerContext* ctx,
                                                     const v1::OpenStepLinkRequest*,
                                                     v1::OpenStepLinkResponse* resp) {
  // The key goes only to the admitted controller: whoever holds it can run step commands.
  if (auto a = AdmitController(*ctx, "Agent.OpenStepLink"); !a.ok()) return Refuse(ctx, a);
  if (!step_links_) {
    return Done(ctx, absl::FailedPreconditionError(
                         "step links are off on this agent (step_link.enabled: false)"));
  }
  auto grant = step_links_->Issue();
  if (grant.ok()) {
    resp->set_port(grant->port);
    resp->set_link_id(std::move(grant->link_id));
    resp->set_key(std::move(grant->key));
  }
  return Done(ctx, grant.status());
}

absl::Status AgentService::StartStepLinks(const StepLinkOptions& options) {
  auto server = StepLinkServer::Start(options, [this](v1::StepCommand command,
                                                      std::function<void(v1::StepReply)> reply) {
    RunStepCommand(node_, &long_calls_, ExecuteOn::kCaller, std::move(command), std::move(reply));
  });
  if (!server.ok()) return server.status();
  step_links_ = std::move(*server);
  return absl::OkStatus();
}

}  // namespace wb::service
