// Planning hand-written layouts in Catch2 tests: with the default fusion rules (qkv_proj,
// gate_up_proj), and the check that a layout is rejected.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/planner/plan.h"

namespace wb::planner::testing {

// Plans `agents` with the default fusion rules added to `options`.
inline absl::StatusOr<Plan> PlanFused(const std::vector<AgentLayout>& agents,
                                      PlanOptions options = {}) {
  options.fusions = DefaultFusionRules();
  return BuildPlan(agents, options);
}

// REQUIREs that PlanFused rejects `agents` as invalid; returns the rejection's message.
inline std::string Rejection(const std::vector<AgentLayout>& agents, PlanOptions options = {}) {
  auto plan = PlanFused(agents, std::move(options));
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(plan.status().message());
}

}  // namespace wb::planner::testing
