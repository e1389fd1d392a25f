#include "common/planner/delta_model.h"

#include <algorithm>

namespace wb::planner {

DeltaPrediction PredictDeltaStep(const PlanStats& stats, const DeltaModel& model) {
  DeltaPrediction p;
  const double element = std::max(1e-9, model.element_bytes);
  p.packed_fraction = std::clamp(
      model.changed_fraction * (model.element_bytes + model.index_bytes) / element, 0.0, 1.0);
  uint64_t send_max = 0, recv_max = 0;
  for (uint64_t b : stats.device_send_bytes) send_max = std::max(send_max, b);
  for (uint64_t b : stats.receiver_device_bytes) recv_max = std::max(recv_max, b);
  p.encode_seconds = model.encode_gbps > 0 ? send_max / (model.encode_gbps * 1e9) : 0;
  const double per_op = std::max(0.0, stats.predicted_step_seconds - stats.link_limit_seconds);
  p.send_seconds = stats.link_limit_seconds * p.packed_fraction + per_op;
  p.apply_seconds =
      model.apply_gbps > 0 ? recv_max * p.packed_fraction / (model.apply_gbps * 1e9) : 0;
  p.seconds = std::max(p.encode_seconds, p.send_seconds) + p.apply_seconds;
  return p;
}

}  // namespace wb::planner
