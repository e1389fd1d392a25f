#include "common/planner/delta_model.h"

#include <algorithm>

namespace wb::planner {

double PackedFraction(const DeltaModel& model) {
  const double element = std::max(1e-9, model.element_bytes);
  return std::clamp(model.changed_fraction * (model.element_bytes + model.index_bytes) / element,
                    0.0, 1.0);
}

DeltaPrediction DeltaStepFromParts(double encode_seconds, double apply_seconds,
                                   double packed_fraction, double link_limit_seconds,
                                   double predicted_step_seconds) {
  DeltaPrediction p;
  p.packed_fraction = packed_fraction;
  p.encode_seconds = encode_seconds;
  const double per_op = std::max(0.0, predicted_step_seconds - link_limit_seconds);
  p.send_seconds = link_limit_seconds * packed_fraction + per_op;
  p.apply_seconds = apply_seconds;
  p.seconds = std::max(p.encode_seconds, p.send_seconds) + p.apply_seconds;
  return p;
}

DeltaPrediction PredictDeltaStep(const PlanStats& stats, const DeltaModel& model) {
  const double packed = PackedFraction(model);
  uint64_t send_max = 0, recv_max = 0;
  for (uint64_t b : stats.device_send_bytes) send_max = std::max(send_max, b);
  for (uint64_t b : stats.receiver_device_bytes) recv_max = std::max(recv_max, b);
  const double encode = model.encode_gbps > 0 ? send_max / (model.encode_gbps * 1e9) : 0;
  const double apply = model.apply_gbps > 0 ? recv_max * packed / (model.apply_gbps * 1e9) : 0;
  return DeltaStepFromParts(encode, apply, packed, stats.link_limit_seconds,
                            stats.predicted_step_seconds);
}

}  // namespace wb::planner
