#include "controller/controller_metrics.h"

namespace wb::controller {

ControllerMetrics::ControllerMetrics(ControllerCore* core, metrics::Registry* registry,
                                     const ControllerRole* role)
    : core_(core) {
  if (role != nullptr) {
    // Who leads (issue 45): each controller of an election says whether it is the leader.
    registry->AddCallbackGauge(
        "weightbeam_controller_leader",
        "1 while this controller leads its election (ha:), 0 while it stands by or takes over.",
        [role] { return role->Describe().state() == "leader" ? 1.0 : 0.0; });
    registry->AddCallbackGauge(
        "weightbeam_controller_leader_epoch",
        "The epoch of the leader this controller knows (the election key's etcd revision).",
        [role] { return static_cast<double>(role->Describe().epoch()); });
    registry->AddCallbackGauge(
        "weightbeam_controller_standbys", "Candidates of this election other than the leader.",
        [role] { return static_cast<double>(role->Describe().standbys_size()); });
    registry->AddCallbackGauge(
        "weightbeam_controller_role_since_seconds",
        "Unix time at which this controller's role (leader, standby, taking over) began.",
        [role] { return role->Describe().since_unix_ms() / 1000.0; });
  }
  step_seconds_ = registry
                      ->AddHistogram("weightbeam_controller_step_duration_seconds",
                                     "Wall time of Controller.Step, begin to commit or abort.",
                                     metrics::DurationBuckets())
                      .Get();
  trainer_stall_ = registry
                       ->AddHistogram("weightbeam_trainer_stall_seconds",
                                      "How long each committed step held the trainer: until every "
                                      "sender captured, or the whole step when they read in place.",
                                      metrics::DurationBuckets())
                       .Get();
  inference_pause_ =
      registry
          ->AddHistogram("weightbeam_inference_pause_seconds",
                         "How long each committed replica's live tensors were being written in a "
                         "step: the swap from staging, or the whole transfer in place.",
                         metrics::DurationBuckets())
          .Get();
  auto& steps = registry->AddCounter("weightbeam_steps_total",
                                     "Steps run by the controller, by outcome.", {"result"});
  committed_ = steps.WithLabels({"committed"});
  failed_ = steps.WithLabels({"failed"});
  registry->AddCallbackGauge("weightbeam_agents_alive", "Registered agents sending heartbeats.",
                             [core] { return core->membership().CountAgents(false); });
  registry->AddCallbackGauge("weightbeam_agents_lost",
                             "Registered agents that missed their heartbeats.",
                             [core] { return core->membership().CountAgents(true); });
  registry->AddCallbackGauge("weightbeam_plan_ops", "Operations in the current plan.", [core] {
    return static_cast<double>(core->CurrentPlan().total_ops());
  });
  registry->AddCallbackGauge(
      "weightbeam_plan_bytes", "Bytes one step of the current plan moves.",
      [core] { return static_cast<double>(core->CurrentPlan().total_bytes()); });
  registry->AddCallbackGauge("weightbeam_plan_predicted_step_seconds",
                             "The cost model's prediction for one step of the current plan.",
                             [core] { return core->CurrentPlan().predicted_step_seconds(); });
  replica_version_ = &registry->AddGauge(
      "weightbeam_replica_committed_version",
      "The version each inference replica last committed (docs/elastic.md).", {"replica"});
  replica_staleness_ = &registry->AddGauge(
      "weightbeam_replica_staleness_steps",
      "Committed versions since each inference replica's own (0: serving the latest).",
      {"replica"});
  subscription_ = core->steps().Subscribe([this](const weightbeam::v1::StepResult& r) {
    step_seconds_->Observe(r.seconds());
    (r.ok() ? committed_ : failed_)->Increment();
    if (r.ok()) {
      trainer_stall_->Observe(r.trainer_stall_seconds());
      for (const auto& p : r.replica_pauses()) inference_pause_->Observe(p.seconds());
    }
    for (const auto& v : core_->ReplicaVersions()) {
      const std::string label = std::to_string(v.replica);
      replica_version_->WithLabels({label})->Set(static_cast<double>(v.committed_version));
      replica_staleness_->WithLabels({label})->Set(static_cast<double>(v.staleness));
    }
  });
}

ControllerMetrics::~ControllerMetrics() { core_->steps().Unsubscribe(subscription_); }

}  // namespace wb::controller
