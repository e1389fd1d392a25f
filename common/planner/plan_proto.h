// Converters between the planner's plain structs and the weightbeam.v1 wire types: agent
// layouts in (AgentInfo for NICs + AgentLayout for tensors), per-agent plans and the plan
// summary out. Kept apart so the planner itself never touches protobuf messages per op.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/planner/layout.h"
#include "common/planner/plan.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::planner {

// NICs come from `info`, tensors from `layout`; `info.name` and `layout.agent` must agree.
absl::StatusOr<AgentLayout> LayoutFromProto(const weightbeam::v1::AgentInfo& info,
                                            const weightbeam::v1::AgentLayout& layout);
// `in` must not be a mirror (UnfoldMirrors first): its entries live in its template.
void LayoutToProto(const AgentLayout& in, weightbeam::v1::AgentInfo* info,
                   weightbeam::v1::AgentLayout* layout);

weightbeam::v1::TransferOp OpToProto(const std::vector<AgentLayout>& agents, const PlannedOp& op,
                                     uint64_t op_id);

// One AgentPlan per agent that sends something, in name order; op ids count from 0 per agent.
// Peers list each receiver with the destination regions this agent writes (region id and
// length; the controller adds endpoints, NICs and remote keys).
std::vector<weightbeam::v1::AgentPlan> PlanToProto(const std::vector<AgentLayout>& agents,
                                                   const Plan& plan, uint64_t plan_id);

weightbeam::v1::PlanSummary SummaryToProto(const std::vector<AgentLayout>& agents, const Plan& plan,
                                           uint64_t plan_id);

}  // namespace wb::planner
