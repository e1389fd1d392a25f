#include "controller/plan_builder.h"

namespace wb::controller {

// Placeholder until the planner lands.
absl::StatusOr<BuiltPlan> BuildPlan(const std::vector<AgentRecord>&,
                                    const config::ControllerConfig&, uint64_t) {
  return absl::UnimplementedError("planner not built yet");
}

}  // namespace wb::controller
