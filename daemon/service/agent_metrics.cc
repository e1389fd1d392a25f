#include "daemon/service/agent_metrics.h"

namespace wb::service {

AgentMetrics::AgentMetrics(metrics::Registry* registry) : registry_(registry) {
  step_seconds_ = registry
                      ->AddHistogram("weightbeam_agent_step_duration_seconds",
                                     "Time this agent spent executing its operations of a step.",
                                     metrics::DurationBuckets())
                      .Get();
  steps_ =
      &registry->AddCounter("weightbeam_agent_steps_total",
                            "Steps this agent executed, by result (ok or failed).", {"result"});
  bytes_sent_ = &registry->AddCounter(
      "weightbeam_bytes_sent_total",
      "Bytes written to a peer agent and acknowledged, by transport and destination agent.",
      {"transport", "peer"});
  bytes_received_ = &registry->AddCounter(
      "weightbeam_bytes_received_total",
      "Bytes that landed in this agent's regions, by transport and sending agent (only "
      "transports that see arrivals: tcp, local; not one-sided RDMA).",
      {"transport", "peer"});
  fenced_writes_ = &registry->AddCounter(
      "weightbeam_fenced_writes_total",
      "Writes refused by this agent's step fence: tagged with a step other than the one it "
      "began (an aborted or timed-out step's late writes), by transport and sending agent.",
      {"transport", "peer"});
  errors_ =
      &registry->AddCounter("weightbeam_errors_total", "Errors on this agent, by kind.", {"kind"});
  transport_regions_ = &registry->AddGauge(
      "weightbeam_transport_regions",
      "Memory registrations this agent holds with a transport for local processes' tensors: one "
      "per buffer (tcp, local, rdma).",
      {"transport"});
  registration_seconds_ = &registry->AddGauge(
      "weightbeam_transport_registration_seconds",
      "Seconds spent in a transport's memory registration since the agent started.", {"transport"});
  for (const char* result : {"ok", "failed"}) steps_->WithLabels({result});
  for (const char* kind : {kStepFailed, kRegistrationRefused, kPlanLoadFailed, kCommitRefused}) {
    errors_->WithLabels({kind});
  }
}

void AgentMetrics::AddGauges(Sources s) {
  registry_->AddCallbackGauge("weightbeam_ops_in_flight",
                              "Operations whose writes are posted and not yet acknowledged.",
                              std::move(s.ops_in_flight));
  registry_->AddCallbackGauge("weightbeam_staging_bytes_in_flight",
                              "Staging bytes handed out by the staging pool (capped by the "
                              "watermark).",
                              std::move(s.staging_bytes_in_flight));
  registry_->AddCallbackGauge("weightbeam_registered_tensors",
                              "Tensors (regions) registered by local processes.",
                              std::move(s.registered_tensors));
  registry_->AddCallbackGauge("weightbeam_committed_version",
                              "The last weight version committed on this agent (0: none).",
                              std::move(s.committed_version));
}

void AgentMetrics::StepFinished(double seconds, bool ok) {
  step_seconds_->Observe(seconds);
  steps_->WithLabels({ok ? "ok" : "failed"})->Increment();
  if (!ok) Error(kStepFailed);
}

}  // namespace wb::service
