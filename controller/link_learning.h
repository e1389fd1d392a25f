// Plans that learn from the links: after every committed dense step, each sender's measured
// throughput (bytes sent / its write time, per GB/s it is rated at) is compared with the
// typical sender's. A sender well below the others is on a link that turned slow (or shared,
// or throttled): its fraction of the reference is kept per agent, smoothed, bounded and logged,
// and handed to the planner as CostModel::agent_rate_scale. The planner then prices that
// agent's rails at the measured speed and, where sources have copies (data-parallel replicas),
// gives it less work. The controller plans again when a fraction moved far from the one its
// plan used.
//
// Relative, not absolute: a step that is receiver-bound (or CPU-bound) slows every sender
// alike, and that says nothing about any one link. Delta steps (few bytes, CPU-bound) and
// failed steps teach nothing.
//
// Every figure is self-reported by an agent (its rated GB/s, bytes sent, seconds), so no agent
// may decide for the others (issue 41, item 10): the reference is the median sender's figure
// (the upper median), never above kMaxLead times the lower median, so one agent claiming to be
// fast (`gbps: 0.001`, inflated bytes) prices the others down by at most 1/kMaxLead with two
// senders and not at all with three or more. And in time: a slower link is taken at once, a
// faster one only after kConfirmSteps steps in a row say so (a link flapping between two
// speeds stays priced at the slower), an agent not measured (no work) decays back toward its
// rating, and a replan comes at most once every kMinReplanSteps steps. A relay is measured by
// what it forwards (bytes_forwarded over forward_seconds, the time its writes were on the
// wire), never by how long it waited for bytes to land.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "weightbeam/v1/types.pb.h"

namespace wb::controller {

class LinkLearner {
 public:
  // Bounds: a link is never taken for slower than kFloor of its rating (a stalled step says
  // "very slow", not "dead": the deadline handles dead), and fractions above kHealthy count as
  // healthy (1). A measured fraction more than kJump below (relative) the estimate replaces it
  // at once (the link changed); one more than kJump above it does so once kConfirmSteps
  // steps in a row measured it there; closer ones are smoothed with weight kSmoothing.
  static constexpr double kFloor = 1.0 / 16;
  static constexpr double kHealthy = 0.9;
  static constexpr double kJump = 0.3;
  static constexpr double kSmoothing = 0.3;
  static constexpr int kConfirmSteps = 3;
  // The reference is at most this many times the lower median sender's figure.
  static constexpr double kMaxLead = 4;
  // An agent not measured in a committed step moves this fraction of the way back to healthy.
  static constexpr double kDecay = 0.1;
  // Plan again when an agent's estimate differs from the plan's by more than this (relative),
  // at most once every kMinReplanSteps observed steps.
  static constexpr double kReplanChange = 0.2;
  static constexpr int kMinReplanSteps = 4;
  // Senders that moved less than this many bytes in a step say nothing about their link.
  static constexpr uint64_t kMinBytes = 1 << 20;

  // A committed step's reports; `rated_gbps`: agent -> the GB/s its rails are rated at (agents
  // absent or at 0 count as 1). `relays`: agents whose ops only forward, measured by their
  // forwarded bytes and forward_seconds (their step time is mostly waiting for bytes to land:
  // not a measure of their link). Returns one line per estimate that changed ("" if none).
  std::string Observe(const weightbeam::v1::StepResult& step,
                      const std::map<std::string, double>& rated_gbps,
                      const std::set<std::string>& relays = {});

  // Agent -> fraction of its rating (< 1), for CostModel::agent_rate_scale.
  std::map<std::string, double> Scales() const;
  // Why a plan made with `planned` (Scales() then) is out of date: "" when no agent's estimate
  // moved more than kReplanChange from it, or when the last reason given was less than
  // kMinReplanSteps observed steps ago. A reason given counts as a replan.
  std::string ReplanReason(const std::map<std::string, double>& planned);

 private:
  std::map<std::string, double> estimate_;    // agent -> fraction (only agents measured slow)
  std::map<std::string, int> faster_;         // agent -> steps in a row measured well above it
  int steps_since_replan_ = kMinReplanSteps;  // the first reason is given at once
};

}  // namespace wb::controller
