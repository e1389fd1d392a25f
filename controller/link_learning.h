// Plans that learn from the links: after every committed dense step, each sender's measured
// throughput (bytes sent / its write time, per GB/s it is rated at) is compared with the
// fastest sender's. A sender well below the others is on a link that turned slow (or shared,
// or throttled): its fraction of the best is kept per agent, smoothed, bounded and logged, and
// handed to the planner as CostModel::agent_rate_scale. The planner then prices that agent's
// rails at the measured speed and, where sources have copies (data-parallel replicas), gives it
// less work. The controller plans again when a fraction moved far from the one its plan used.
//
// Relative, not absolute: a step that is receiver-bound (or CPU-bound) slows every sender
// alike, and that says nothing about any one link. Delta steps (few bytes, CPU-bound) and
// failed steps teach nothing.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "weightbeam/v1/types.pb.h"

namespace wb::controller {

class LinkLearner {
 public:
  // Bounds: a link is never taken for slower than kFloor of its rating (a stalled step says
  // "very slow", not "dead": the deadline handles dead), and fractions above kHealthy count as
  // healthy (1). A measured fraction more than kJump away (relative) from the estimate replaces
  // it at once (the link changed); closer ones are smoothed with weight kSmoothing.
  static constexpr double kFloor = 1.0 / 16;
  static constexpr double kHealthy = 0.9;
  static constexpr double kJump = 0.3;
  static constexpr double kSmoothing = 0.3;
  // Plan again when an agent's estimate differs from the plan's by more than this (relative).
  static constexpr double kReplanChange = 0.2;
  // Senders that moved less than this many bytes in a step say nothing about their link.
  static constexpr uint64_t kMinBytes = 1 << 20;

  // A committed step's reports; `rated_gbps`: agent -> the GB/s its rails are rated at (agents
  // absent or at 0 count as 1). Returns one line per estimate that changed ("" if none).
  std::string Observe(const weightbeam::v1::StepResult& step,
                      const std::map<std::string, double>& rated_gbps);

  // Agent -> fraction of its rating (< 1), for CostModel::agent_rate_scale.
  std::map<std::string, double> Scales() const;
  // Why a plan made with `planned` (Scales() then) is out of date: "" when no agent's estimate
  // moved more than kReplanChange from it.
  std::string ReplanReason(const std::map<std::string, double>& planned) const;

 private:
  std::map<std::string, double> estimate_;  // agent -> fraction (only agents measured slow)
};

}  // namespace wb::controller
