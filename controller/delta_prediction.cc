#include "controller/delta_prediction.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

namespace {

double Smooth(double old, double measured, double weight) {
  return old < 0 ? measured : old + weight * (measured - old);
}

}  // namespace

DeltaStepPredictor::Prediction DeltaStepPredictor::Predict(const v1::PlanSummary& plan) const {
  planner::DeltaModel configured;  // BF16 values, 2-byte gaps: the codec's packing
  configured.changed_fraction = config_.predict_changed_fraction;
  const double packed =
      packed_fraction_ >= 0 ? packed_fraction_ : planner::PackedFraction(configured);
  double encode = 0;
  for (const v1::PeerBytes& s : plan.senders()) {
    auto it = encode_gbps_.find(s.agent());
    const double gbps = it != encode_gbps_.end() ? it->second : config_.predict_encode_gbps;
    encode = std::max(encode, s.bytes() / (gbps * 1e9));
  }
  uint64_t busiest = 0;
  for (const v1::PeerBytes& r : plan.receivers()) busiest = std::max<uint64_t>(busiest, r.bytes());
  const double apply_gbps = apply_gbps_ > 0 ? apply_gbps_ : config_.predict_apply_gbps;
  Prediction p;
  static_cast<planner::DeltaPrediction&>(p) =
      planner::DeltaStepFromParts(encode, busiest * packed / (apply_gbps * 1e9), packed,
                                  plan.link_limit_seconds(), plan.predicted_step_seconds());
  p.basis = observed_ == 0 ? "configured rates (delta.predict_*)"
                           : absl::StrCat("rates measured over ", observed_, " delta step(s)");
  return p;
}

void DeltaStepPredictor::Observe(const v1::StepResult& step, const v1::PlanSummary& plan) {
  if (!step.ok() || step.delta_anchor() || step.delta_ops() == 0 || step.bytes_dense() == 0) {
    return;
  }
  double slowest_sender = 0;
  for (const v1::AgentStepReport& a : step.agents()) {
    if (!a.ok() || a.bytes_dense() == 0 || !(a.seconds() > 0)) continue;
    slowest_sender = std::max(slowest_sender, a.seconds());
    double& rate = encode_gbps_.try_emplace(a.agent(), -1).first->second;
    rate = Smooth(rate, a.bytes_dense() / a.seconds() / 1e9, kSmoothing);
  }
  const double packed = static_cast<double>(step.bytes()) / step.bytes_dense();
  packed_fraction_ = Smooth(packed_fraction_, packed, kSmoothing);
  uint64_t busiest = 0;
  for (const v1::PeerBytes& r : plan.receivers()) busiest = std::max<uint64_t>(busiest, r.bytes());
  // What the step took after its slowest sender: at least a millisecond, so a step that ended
  // with its senders does not claim an infinite apply rate.
  const double tail = std::max(1e-3, step.seconds() - slowest_sender);
  if (busiest > 0) apply_gbps_ = Smooth(apply_gbps_, busiest * packed / tail / 1e9, kSmoothing);
  ++observed_;
}

std::string DeltaStepPredictor::Describe(const Prediction& p) {
  return absl::StrFormat(
      "delta model: %.3f s (encode %.3f, send %.3f, apply %.3f; packed %.2f %% of the dense "
      "bytes; %s)",
      p.seconds, p.encode_seconds, p.send_seconds, p.apply_seconds, p.packed_fraction * 100,
      p.basis);
}

}  // namespace wb::controller
