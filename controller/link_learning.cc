#include "controller/link_learning.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

std::string LinkLearner::Observe(const v1::StepResult& step,
                                 const std::map<std::string, double>& rated_gbps,
                                 const std::set<std::string>& relays) {
  if (!step.ok() || step.delta_ops() > 0) return "";
  ++steps_since_replan_;
  // Each sender's throughput per rated GB/s.
  struct Sender {
    double gbps = 0;       // measured, GB/s
    double per_rated = 0;  // measured / rated
  };
  std::map<std::string, Sender> senders;
  std::vector<double> figures;
  for (const v1::AgentStepReport& a : step.agents()) {
    // A relay by what it forwarded over the time its writes were on the wire; a sender by
    // what it sent over its step.
    const bool relay = relays.count(a.agent()) > 0;
    const uint64_t bytes = relay ? a.bytes_forwarded() : a.bytes_sent();
    const double seconds = relay ? a.forward_seconds() : a.seconds();
    if (!a.ok() || bytes < kMinBytes || !(seconds > 0)) continue;
    auto rated = rated_gbps.find(a.agent());
    Sender& s = senders[a.agent()];
    s.gbps = bytes / seconds / 1e9;
    s.per_rated = s.gbps / (rated != rated_gbps.end() && rated->second > 0 ? rated->second : 1);
    figures.push_back(s.per_rated);
  }
  std::vector<std::string> changes;
  // Agents with an estimate this step did not measure drift back toward their rating: one
  // priced down until it got no work is measured again once it gets some.
  for (auto it = estimate_.begin(); it != estimate_.end();) {
    if (senders.count(it->first)) {
      ++it;
      continue;
    }
    const double old = it->second;
    const double next = old + kDecay * (1 - old);
    changes.push_back(absl::StrFormat("%s not measured; its link estimate decays %.2f -> %.2f",
                                      it->first, old, next >= kHealthy ? 1.0 : next));
    if (next >= kHealthy) {
      faster_.erase(it->first);
      it = estimate_.erase(it);
    } else {
      it->second = next;
      ++it;
    }
  }
  if (senders.size() < 2) return absl::StrJoin(changes, "; ");  // nothing to compare with
  // The reference: the upper median, at most kMaxLead times the lower median.
  std::sort(figures.begin(), figures.end());
  const double lower = figures[(figures.size() - 1) / 2];
  const double upper = figures[figures.size() / 2];
  const double reference = std::min(upper, kMaxLead * lower);
  if (!(reference > 0)) return absl::StrJoin(changes, "; ");
  for (const auto& [agent, s] : senders) {
    double measured = std::clamp(s.per_rated / reference, kFloor, 1.0);
    if (measured >= kHealthy) measured = 1;
    auto it = estimate_.find(agent);
    const double old = it == estimate_.end() ? 1.0 : it->second;
    double next = old;
    int& faster = faster_[agent];
    if (measured / old - 1 > kJump) {
      // Faster by far: taken once it holds for kConfirmSteps steps in a row.
      next = ++faster >= kConfirmSteps ? measured : old;
    } else {
      faster = 0;
      next = old - measured > kJump * old ? measured : old + kSmoothing * (measured - old);
    }
    if (next >= kHealthy) next = 1;
    if (next >= 1) faster_.erase(agent);
    if (next == old) continue;
    if (next >= 1) {
      estimate_.erase(agent);
    } else {
      estimate_[agent] = next;
    }
    changes.push_back(absl::StrFormat(
        "%s sent at %.3g GB/s, %.2f of the median sender per rated GB/s; its link estimate "
        "%.2f -> %.2f",
        agent, s.gbps, s.per_rated / reference, old, next));
  }
  return absl::StrJoin(changes, "; ");
}

std::map<std::string, double> LinkLearner::Scales() const { return estimate_; }

std::string LinkLearner::ReplanReason(const std::map<std::string, double>& planned) {
  if (steps_since_replan_ < kMinReplanSteps) return "";
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
  if (!moved.empty()) steps_since_replan_ = 0;
  return absl::StrJoin(moved, "; ");
}

}  // namespace wb::controller
