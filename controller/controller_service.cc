#include "controller/controller_service.h"

#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc/status_util.h"
#include "common/identity/incarnation_digest.h"
#include "common/process/malloc_arenas.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

namespace {
// Finishes a call whose answer is large (10^6 tensors listed): once gRPC has sent and freed it,
// what it held goes back to the kernel.
class ReleaseWhenDone : public grpc::ServerUnaryReactor {
 public:
  void OnDone() override {
    ReturnFreeMemory();
    delete this;
  }
};

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const grpc::Status& s) {
  auto* r = ctx->DefaultReactor();
  r->Finish(s);
  return r;
}

// StepAsync's answers, written in order as the step thread hands them over; the stream ends
// after the last. A caller that went away only stops the writes: the step runs to its end.
class StepProgressWriter : public grpc::ServerWriteReactor<v1::StepProgress> {
 public:
  // From the step thread; `last` ends the stream once written. The caller must not touch the
  // writer after handing over the last answer.
  void Send(v1::StepProgress progress, bool last) {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(progress));
      last_ = last_ || last;
      start = !writing_;
      writing_ = true;
    }
    if (start) Next();
  }
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) broken_ = true;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  // Writes the next answer, or ends the stream after the last; run by whoever holds `writing_`.
  void Next() {
    const v1::StepProgress* next = nullptr;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (broken_) queue_.clear();
      if (!queue_.empty()) {
        next = &queue_.front();  // a deque keeps it in place while more are pushed
      } else {
        writing_ = false;
        finish = last_;
      }
    }
    if (next != nullptr) {
      StartWrite(next);
    } else if (finish) {
      Finish(grpc::Status::OK);
    }
  }

  absl::Mutex mu_;
  std::deque<v1::StepProgress> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool last_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};
}  // namespace

grpc::ServerUnaryReactor* ControllerService::RegisterAgent(grpc::CallbackServerContext* ctx,
                                                           const v1::RegisterAgentRequest* req,
                                                           v1::RegisterAgentResponse* resp) {
  // With client certificates, an agent registers under the name its certificate carries.
  if (auto s = guard_.AdmitIdentity(*ctx, req->agent().name(), "Controller.RegisterAgent");
      !s.ok()) {
    return Done(ctx, s);
  }
  if (req->agent().name().empty() || req->agent().control_endpoint().empty()) {
    return Done(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  "an agent must give its name and control endpoint"));
  }
  // The request is ours until Finish: move its layout (10^6 tensors are ~1 GB in memory)
  // instead of copying it.
  if (auto s = CheckLayout(req->agent().name(), req->layout()); !s.ok())
    return Done(ctx, ToGrpc(s));
  auto* mutable_req = const_cast<v1::RegisterAgentRequest*>(req);
  // Asked only when the name is held and the caller claims a restart at the holder's endpoint.
  auto endpoint_answers_as_caller = [&] {
    const std::string& endpoint = req->agent().control_endpoint();
    core_->agent_channels().ResetBackoff(endpoint);
    grpc::ClientContext call;
    call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    // The channel may still be failing from the old process: wait for the new one to connect
    // rather than answer "unavailable" at once (the agent would retry its registration later).
    call.set_wait_for_ready(true);
    v1::HealthResponse health;
    const grpc::Status s =
        core_->agent_channels().Get(endpoint)->Health(&call, v1::HealthRequest(), &health);
    return s.ok() && !health.incarnation_digest().empty() &&
           health.incarnation_digest() == identity::IncarnationDigest(req->incarnation());
  };
  // Asked when the name is held and the caller registers from elsewhere: is the holder still
  // there? Without waiting for a connection: a refused one means nothing listens there.
  auto holder_answer = [&](const std::string& endpoint) -> std::optional<std::string> {
    core_->agent_channels().ResetBackoff(endpoint);
    grpc::ClientContext call;
    call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::HealthResponse health;
    const grpc::Status s =
        core_->agent_channels().Get(endpoint)->Health(&call, v1::HealthRequest(), &health);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return std::nullopt;
    }
    return s.ok() ? health.incarnation_digest() : std::string();
  };
  if (auto s = core_->membership().Register(req->agent(), std::move(*mutable_req->mutable_layout()),
                                            req->incarnation(), PeerHost(ctx->peer()),
                                            endpoint_answers_as_caller, holder_answer);
      !s.ok()) {
    return Done(ctx, ToGrpc(s));
  }
  core_->agent_channels().ResetBackoff(req->agent().control_endpoint());
  resp->set_epoch(core_->membership().epoch());
  resp->set_heartbeat_interval_ms(heartbeat_interval_ms_);
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* ControllerService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  if (auto s = guard_.AdmitIdentity(*ctx, req->agent(), "Controller.Heartbeat"); !s.ok()) {
    return Done(ctx, s);
  }
  *resp = core_->membership().Heartbeat(*req);
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* ControllerService::ReportLayout(grpc::CallbackServerContext* ctx,
                                                          const v1::ReportLayoutRequest* req,
                                                          v1::ReportLayoutResponse*) {
  if (auto s = guard_.AdmitIdentity(*ctx, req->layout().agent(), "Controller.ReportLayout");
      !s.ok()) {
    return Done(ctx, s);
  }
  const std::string agent = req->layout().agent();
  if (auto s = CheckLayout(agent, req->layout()); !s.ok()) return Done(ctx, ToGrpc(s));
  auto* mutable_req = const_cast<v1::ReportLayoutRequest*>(req);  // ours until Finish
  if (!core_->membership().IsIncarnation(agent, req->incarnation()) ||
      !core_->membership().ReportLayout(std::move(*mutable_req->mutable_layout()))) {
    return Done(ctx,
                grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                             absl::StrCat("agent ", agent, " is not registered; register first")));
  }
  return Done(ctx, grpc::Status::OK);
}

grpc::Status ControllerService::AdmitDriver(const grpc::CallbackServerContext& ctx) const {
  if (auto s = guard_.Admit(ctx); !s.ok()) return s;
  return role_ ? role_->MayLead() : grpc::Status::OK;
}

grpc::ServerUnaryReactor* ControllerService::Plan(grpc::CallbackServerContext* ctx,
                                                  const v1::PlanRequest* req,
                                                  v1::PlanResponse* resp) {
  if (auto s = AdmitDriver(*ctx); !s.ok()) return Done(ctx, s);
  auto* reactor = ctx->DefaultReactor();
  plans_.Submit(
      *req, [ctx] { return ctx->IsCancelled(); },
      [reactor, resp](absl::StatusOr<v1::PlanSummary> summary) {
        if (summary.ok()) *resp->mutable_summary() = *summary;
        reactor->Finish(ToGrpc(summary.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::Rollback(grpc::CallbackServerContext* ctx,
                                                      const v1::RollbackRequest* req,
                                                      v1::RollbackResponse* resp) {
  if (auto s = AdmitDriver(*ctx); !s.ok()) return Done(ctx, s);
  auto* reactor = ctx->DefaultReactor();
  std::thread([this, reactor, req, resp] {
    *resp->mutable_result() =
        core_->Rollback(req->to(), {req->replicas().begin(), req->replicas().end()});
    reactor->Finish(grpc::Status::OK);
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* ControllerService::Step(grpc::CallbackServerContext* ctx,
                                                  const v1::StepRequest* req,
                                                  v1::StepResponse* resp) {
  if (auto s = AdmitDriver(*ctx); !s.ok()) return Done(ctx, s);
  auto* reactor = ctx->DefaultReactor();
  std::thread([this, reactor, req, resp] {
    auto timeout =
        std::chrono::milliseconds(req->timeout_ms() ? req->timeout_ms() : step_timeout_ms_);
    std::optional<uint32_t> max_staleness;
    if (req->has_max_staleness()) max_staleness = req->max_staleness();
    *resp->mutable_result() =
        core_->Step(req->version(), timeout, max_staleness, nullptr,
                    {req->changed().begin(), req->changed().end()}, req->retry());
    reactor->Finish(grpc::Status::OK);
  }).detach();
  return reactor;
}

grpc::ServerWriteReactor<v1::StepProgress>* ControllerService::StepAsync(
    grpc::CallbackServerContext* ctx, const v1::StepRequest* req) {
  if (auto s = AdmitDriver(*ctx); !s.ok()) {
    return new security::RefusedWriter<v1::StepProgress>(s);
  }
  auto* writer = new StepProgressWriter();
  std::thread([this, writer, req] {
    auto timeout =
        std::chrono::milliseconds(req->timeout_ms() ? req->timeout_ms() : step_timeout_ms_);
    std::optional<uint32_t> max_staleness;
    if (req->has_max_staleness()) max_staleness = req->max_staleness();
    v1::StepProgress done;
    *done.mutable_result() = core_->Step(
        req->version(), timeout, max_staleness,
        [writer](const v1::StepCaptured& c) {
          v1::StepProgress captured;
          *captured.mutable_captured() = c;
          writer->Send(std::move(captured), false);
        },
        {req->changed().begin(), req->changed().end()}, req->retry());
    writer->Send(std::move(done), true);
  }).detach();
  return writer;
}

grpc::ServerWriteReactor<v1::StepResult>* ControllerService::WatchSteps(
    grpc::CallbackServerContext* ctx, const v1::WatchStepsRequest*) {
  if (auto s = guard_.Admit(*ctx); !s.ok()) {
    return new security::RefusedWriter<v1::StepResult>(s);
  }
  return new BroadcastWriter<v1::StepResult>(&core_->steps());
}

grpc::ServerUnaryReactor* ControllerService::Status(grpc::CallbackServerContext* ctx,
                                                    const v1::StatusRequest*,
                                                    v1::StatusResponse* resp) {
  if (auto s = guard_.Admit(*ctx); !s.ok()) return Done(ctx, s);
  *resp = core_->Status();
  if (role_) *resp->mutable_leadership() = role_->Describe();
  return Done(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* ControllerService::ListTensors(grpc::CallbackServerContext* ctx,
                                                         const v1::ListTensorsRequest* req,
                                                         v1::ListTensorsResponse* resp) {
  if (auto s = guard_.Admit(*ctx); !s.ok()) return Done(ctx, s);
  bool found = req->agent().empty();
  for (const auto& a : core_->membership().Snapshot()) {
    if (!req->agent().empty() && a.info.name() != req->agent()) continue;
    found = true;
    auto* layout = resp->add_layouts();
    layout->set_agent(a.layout->agent());
    layout->set_generation(a.layout->generation());
    // Region keys authorize remote writes: they go only to the senders a plan introduces.
    // Copied field by field without them (copying and then clearing keeps them allocated: a
    // third of 10^6 tensors' memory).
    layout->mutable_tensors()->Reserve(a.layout->tensors_size());
    for (const auto& t : a.layout->tensors()) {
      v1::TensorLayout* c = layout->add_tensors();
      *c->mutable_spec() = t.spec();
      *c->mutable_owner() = t.owner();
      c->mutable_region()->set_region_id(t.region().region_id());
      c->mutable_region()->set_length(t.region().length());
      c->set_location(t.location());
    }
  }
  if (!found) {
    return Done(ctx, grpc::Status(grpc::StatusCode::NOT_FOUND,
                                  absl::StrCat("no agent named '", req->agent(), "'")));
  }
  int64_t listed = 0;
  for (const auto& l : resp->layouts()) listed += l.tensors_size();
  if (listed < 10000) return Done(ctx, grpc::Status::OK);
  auto* reactor = new ReleaseWhenDone();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace wb::controller
