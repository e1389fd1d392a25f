// The controller's Prometheus series (names prefixed weightbeam_): step durations, outcomes and
// who waited for each step (trainer stall, inference pause), heard from the core's step
// broadcaster, and agents alive/lost and the current plan's size, read from the core when scraped.
#pragma once

#include <cstdint>

#include "common/metrics/metric_registry.h"
#include "controller/controller_core.h"
#include "controller/controller_role.h"

namespace wb::controller {

class ControllerMetrics {
 public:
  // `core`, `registry` and `role` (high availability; null: none) must outlive this object.
  ControllerMetrics(ControllerCore* core, metrics::Registry* registry,
                    const ControllerRole* role = nullptr);
  ~ControllerMetrics();
  ControllerMetrics(const ControllerMetrics&) = delete;
  ControllerMetrics& operator=(const ControllerMetrics&) = delete;

 private:
  ControllerCore* core_;
  metrics::Histogram* step_seconds_;
  metrics::Histogram* trainer_stall_;    // StepResult.trainer_stall_seconds
  metrics::Histogram* inference_pause_;  // StepResult.replica_pauses, one sample per replica
  metrics::Counter* committed_;
  metrics::Counter* failed_;
  metrics::Family<metrics::Gauge>* replica_version_;
  metrics::Family<metrics::Gauge>* replica_staleness_;
  uint64_t subscription_ = 0;
};

}  // namespace wb::controller
