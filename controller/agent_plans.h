// Bridges the controller and the pure planner: agents' layouts (protos) in, a BuiltPlan out,
// with each sender's peers introduced (endpoint, NICs, the destination regions it may write).
#pragma once

#include "controller/controller_core.h"

namespace wb::controller {

absl::StatusOr<BuiltPlan> PlanForAgents(const std::vector<AgentRecord>& agents,
                                        const config::ControllerConfig& config, uint64_t plan_id);

}  // namespace wb::controller
