#include "controller/link_learning.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

std::string LinkLearner::Observe(const v1::StepResult& step,
                                 const std::map<std::string, double>& rated_gbps) {
  if (!step.ok() || step.delta_ops() > 0) return "";
  // Each sender's throughput per rated GB/s; the best of them is what a healthy link did.
  struct Sender {
    double gbps = 0;       // measured, GB/s
    double per_rated = 0;  // measured / rated
  };
  std::map<std::string, Sender> senders;
  double best = 0;
  for (const v1::AgentStepReport& a : step.agents()) {
    if (!a.ok() || a.bytes_sent() < kMinBytes || !(a.seconds() > 0)) continue;
    auto rated = rated_gbps.find(a.agent());
    Sender& s = senders[a.agent()];
    s.gbps = a.bytes_sent() / a.seconds() / 1e9;
    s.per_rated = s.gbps / (rated != rated_gbps.end() && rated->second > 0 ? rated->second : 1);
    best = std::max(best, s.per_rated);
  }
  if (senders.size() < 2 || !(best > 0)) return "";  // nothing to compare with
  std::vector<std::string> changes;
  for (const auto& [agent, s] : senders) {
    double measured = std::clamp(s.per_rated / best, kFloor, 1.0);
    if (measured >= kHealthy) measured = 1;
    auto it = estimate_.find(agent);
    const double old = it == estimate_.end() ? 1.0 : it->second;
    double next =
        std::fabs(measured / old - 1) > kJump ? measured : old + kSmoothing * (measured - old);
    if (next >= kHealthy) next = 1;
    if (next == old) continue;
    if (next >= 1) {
      estimate_.erase(agent);
    } else {
      estimate_[agent] = next;
    }
    changes.push_back(absl::StrFormat(
        "%s sent at %.3g GB/s, %.2f of the best sender per rated GB/s; its link estimate %.2f -> "
        "%.2f",
        agent, s.gbps, s.per_rated / best, old, next));
  }
  return absl::StrJoin(changes, "; ");
}

std::map<std::string, double> LinkLearner::Scales() const { return estimate_; }

std::string LinkLearner::ReplanReason(const std::map<std::string, double>& planned) const {
  std::vector<std::string> moved;
  auto value = [](const std::map<std::string, double>& m, const std::string& agent) {
    auto it = m.find(agent);
    return it == m.end() ? 1.0 : it->second;
  };
  std::set<std::string> agents;
  for (const auto& [a, f] : estimate_) agents.insert(a);
  for (const auto& [a, f] : planned) agents.insert(a);
  for (const std::string& agent : agents) {
    const double now = value(estimate_, agent), then = value(planned, agent);
    if (std::fabs(now / then - 1) <= kReplanChange) continue;
    moved.push_back(
        absl::StrFormat("%s's link at %.2f of its rate (planned at %.2f)", agent, now, then));
  }
  return absl::StrJoin(moved, "; ");
}

}  // namespace wb::controller
