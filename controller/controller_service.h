// The Controller gRPC service: a thin layer from RPCs to ControllerCore. gRPC's callback
// threads never block: Plan calls wait on the PlanScheduler's one thread, Steps on their own.
#pragma once

#include "controller/controller_core.h"
#include "controller/controller_role.h"
#include "controller/plan_scheduler.h"
#include "security/call_guard.h"
#include "weightbeam/v1/controller.grpc.pb.h"

namespace wb::controller {

class ControllerService final : public weightbeam::v1::Controller::CallbackService {
 public:
  ControllerService(ControllerCore* core, uint32_t heartbeat_interval_ms, uint32_t step_timeout_ms)
      : core_(core),
        heartbeat_interval_ms_(heartbeat_interval_ms),
        step_timeout_ms_(step_timeout_ms),
        plans_(core) {}
  // Token and certificate checks for every call (default: admit everything).
  void SetGuard(security::CallGuard guard) { guard_ = std::move(guard); }
  // High availability: Plan, Step, StepAsync and Rollback only while `role` leads (null: always).
  void SetRole(const ControllerRole* role) { role_ = role; }

  grpc::ServerUnaryReactor* RegisterAgent(grpc::CallbackServerContext* ctx,
                                          const weightbeam::v1::RegisterAgentRequest* req,
                                          weightbeam::v1::RegisterAgentResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const weightbeam::v1::HeartbeatRequest* req,
                                      weightbeam::v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportLayout(grpc::CallbackServerContext* ctx,
                                         const weightbeam::v1::ReportLayoutRequest* req,
                                         weightbeam::v1::ReportLayoutResponse* resp) override;
  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* ctx,
                                 const weightbeam::v1::PlanRequest* req,
                                 weightbeam::v1::PlanResponse* resp) override;
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* ctx,
                                 const weightbeam::v1::StepRequest* req,
                                 weightbeam::v1::StepResponse* resp) override;
  grpc::ServerUnaryReactor* Rollback(grpc::CallbackServerContext* ctx,
                                     const weightbeam::v1::RollbackRequest* req,
                                     weightbeam::v1::RollbackResponse* resp) override;
  // Step, answering twice: StepProgress.captured once every sender captured, then the result.
  // Admitted as Step is.
  grpc::ServerWriteReactor<weightbeam::v1::StepProgress>* StepAsync(
      grpc::CallbackServerContext* ctx, const weightbeam::v1::StepRequest* req) override;
  grpc::ServerWriteReactor<weightbeam::v1::StepResult>* WatchSteps(
      grpc::CallbackServerContext* ctx, const weightbeam::v1::WatchStepsRequest* req) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const weightbeam::v1::StatusRequest* req,
                                   weightbeam::v1::StatusResponse* resp) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* ctx,
                                        const weightbeam::v1::ListTensorsRequest* req,
                                        weightbeam::v1::ListTensorsResponse* resp) override;

 private:
  ControllerCore* core_;
  uint32_t heartbeat_interval_ms_;
  uint32_t step_timeout_ms_;
  // The guard's admission, then (for the calls that drive agents) the role's.
  grpc::Status AdmitDriver(const grpc::CallbackServerContext& ctx) const;

  security::CallGuard guard_;
  const ControllerRole* role_ = nullptr;
  PlanScheduler plans_;
};

}  // namespace wb::controller
