// What a delta step will take, said before it runs. The planner's cost model prices a dense step
// (bytes over rails); a delta step instead compares every dense byte at the senders, sends the
// packed changes and applies them at the receivers (docs/delta-mode.md). Per plan:
//
//   encode  max over sending agents of dense bytes / encode rate
//   send    the plan's link limit x packed fraction + its per-op part (every op still runs)
//   apply   max over receiving agents of dense bytes x packed fraction / apply rate
//   step    max(encode, send) + apply
//
// The rates and the packed fraction start from configuration (delta.predict_*) and are then
// measured on every committed delta step and smoothed: a sender's encode rate is its dense
// bytes over its step seconds (it compares, packs and sends in that time), the packed fraction
// is bytes sent over dense bytes, and the apply rate is the busiest receiver's packed bytes
// over what the step took after the slowest sender finished (records applied, hashes checked,
// commit). Measured rates are per agent and outlive the plan: they belong to the machines.
#pragma once

#include <map>
#include <string>

#include "common/planner/delta_model.h"
#include "config/config.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::controller {

class DeltaStepPredictor {
 public:
  struct Prediction : planner::DeltaPrediction {
    std::string basis;  // "configured rates" or "rates measured over N delta step(s)"
  };

  explicit DeltaStepPredictor(config::DeltaConfig config) : config_(config) {}

  Prediction Predict(const weightbeam::v1::PlanSummary& plan) const;
  // A committed delta step (anchors and dense steps teach nothing here) of `plan`.
  void Observe(const weightbeam::v1::StepResult& step, const weightbeam::v1::PlanSummary& plan);

  // One line for logs and results: "0.93 s (encode 0.80, send 0.01, apply 0.13; packed 1.2 %;
  // rates measured over 2 delta steps)".
  static std::string Describe(const Prediction& p);

 private:
  static constexpr double kSmoothing = 0.5;  // weight of the newest measurement

  const config::DeltaConfig config_;
  std::map<std::string, double> encode_gbps_;  // sending agent -> measured
  double packed_fraction_ = -1;                // measured; < 0 until a delta step
  double apply_gbps_ = -1;                     // measured (busiest receiver); < 0 until then
  int observed_ = 0;
};

}  // namespace wb::controller
