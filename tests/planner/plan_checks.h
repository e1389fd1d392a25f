// Planning hand-written layouts in Catch2 tests: the check that a layout plans (MustPlan) or is
// rejected (Rejection), optionally with the default fusion rules (qkv_proj, gate_up_proj).
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/planner/plan.h"

namespace wb::planner::testing {

// REQUIREs that BuildPlan plans `agents` (showing the error otherwise); returns the plan.
inline Plan MustPlan(const std::vector<AgentLayout>& agents, const PlanOptions& options = {}) {
  auto plan = BuildPlan(agents, options);
  INFO((plan.ok() ? std::string() : std::string(plan.status().message())));
  REQUIRE(plan.ok());
  return *std::move(plan);
}

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

// MustPlan with the default fusion rules added to `options`.
inline Plan MustPlanFused(const std::vector<AgentLayout>& agents, PlanOptions options = {}) {
  options.fusions = DefaultFusionRules();
  return MustPlan(agents, options);
}

}  // namespace wb::planner::testing
