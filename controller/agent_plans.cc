#include "controller/agent_plans.h"

#include <algorithm>
#include <map>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/parallel/parallel_for.h"
#include "common/planner/plan.h"
#include "common/planner/plan_proto.h"
#include "common/planner/relay.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

absl::StatusOr<BuiltPlan> PlanForAgents(const std::vector<AgentRecord>& agents,
                                        const config::ControllerConfig& config, uint64_t plan_id) {
  std::map<std::string, const AgentRecord*> by_name;
  for (const auto& a : agents) by_name[a.info.name()] = &a;
  BuiltPlan built;
  std::vector<v1::AgentPlan> agent_plans;
  {
    // The planner's copy of the layouts and its plan are dropped before the regions are
    // filled in below: with 10^6 tensors each is hundreds of MB.
    // Converted on every core, one agent at a time each (10^6 tensors take a second or two).
    std::vector<absl::StatusOr<planner::AgentLayout>> converted(agents.size());
    const int threads = static_cast<int>(
        std::min<size_t>(agents.size(), std::max(1u, std::thread::hardware_concurrency())));
    ParallelFor(agents.size(), threads, [&](uint64_t i) {
      converted[i] = planner::LayoutFromProto(agents[i].info, *agents[i].layout);
    });
    std::vector<planner::AgentLayout> layouts;
    layouts.reserve(agents.size());
    for (size_t i = 0; i < agents.size(); ++i) {
      if (!converted[i].ok()) {
        return absl::Status(
            converted[i].status().code(),
            absl::StrCat("agent ", agents[i].info.name(), ": ", converted[i].status().message()));
      }
      layouts.push_back(std::move(*converted[i]));
    }
    converted.clear();
    // Inference replicas laid out alike (the usual fleet) are planned once: each agent that
    // repeats an earlier one becomes its mirror, and its converted entries are freed.
    planner::FoldMirrors(&layouts);
    planner::PlanOptions options;
    options.renames = config.renames;
    options.fusions = config.fusions;
    options.cost = config.cost_model;
    options.relays = config.relays;
    auto plan = planner::BuildPlan(layouts, options);
    if (!plan.ok()) return plan.status();
    built.summary = planner::SummaryToProto(layouts, *plan, plan_id);
    for (const auto& [agent, f] : config.cost_model.agent_rate_scale) {
      (*built.summary.mutable_link_rate_scale())[agent] = f;
    }
    agent_plans = planner::PlanToProto(layouts, *plan, plan_id);
    for (size_t a = 0; a < layouts.size(); ++a) {
      const std::vector<int32_t> children = planner::RelayChildren(*plan, static_cast<int32_t>(a));
      if (children.empty()) continue;
      auto& names = built.relay_children[layouts[a].name];
      for (int32_t c : children) names.push_back(layouts[c].name);
      if (!plan->stats.is_sender[a]) built.relay_only.insert(layouts[a].name);
    }
  }
  std::map<std::string, std::unordered_map<uint64_t, const v1::RegionDescriptor*>> regions_of;
  for (v1::AgentPlan& agent_plan : agent_plans) {
    // Introduce each receiver: where to reach it and the keys of the regions we may write.
    for (v1::PeerIntro& peer : *agent_plan.mutable_peers()) {
      const AgentRecord* receiver = by_name.at(peer.agent());
      peer.set_control_endpoint(receiver->info.control_endpoint());
      *peer.mutable_nics() = receiver->info.nics();
      // Built once per receiver (not per sender-receiver pair): 10^6 tensors are common.
      auto& regions = regions_of[peer.agent()];
      if (regions.empty()) {
        regions.reserve(receiver->layout->tensors_size());
        for (const auto& t : receiver->layout->tensors())
          regions[t.region().region_id()] = &t.region();
      }
      for (v1::RegionDescriptor& r : *peer.mutable_regions()) {
        auto it = regions.find(r.region_id());
        if (it == regions.end()) {
          return absl::InternalError(absl::StrCat("plan names region ", r.region_id(),
                                                  " that agent ", peer.agent(), " did not report"));
        }
        r = *it->second;
      }
    }
    std::string name = agent_plan.agent();
    built.agent_plans[name] = std::move(agent_plan);
  }
  return built;
}

}  // namespace wb::controller
