// Relays: a later inference replica takes its bytes from an earlier replica's agent once they
// have landed there, instead of from the senders (issue 30). Only agents that hold the same
// entries can relay to each other (a template and its replica mirrors, layout.h), so a relay op
// is a plain copy of destination bytes as they lie: the same tensor, the same offsets, FP8
// scales included. The planner chooses the tree (Plan::relay) with its cost model when
// PlanOptions::relays asks for it; these helpers read it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/planner/plan.h"

namespace wb::planner {

// The grain of relay ops: a relay forwards the bytes landed in each of its destination regions
// as contiguous runs of at most this many bytes (adjacent landed ops coalesce, so a relay
// executes about one op per chunk however small the senders' ops were), each as soon as every
// byte of it has landed; each relay level adds about one chunk's transfer to the step.
inline constexpr uint64_t kRelayChunkBytes = uint64_t{4} << 20;

// Whether destination agent `agent` is fed by a relay rather than by the senders.
inline bool IsRelayed(const Plan& plan, int32_t agent) {
  const RelayTree& r = plan.relay;
  return r.roots > 0 && r.family_pos[agent] >= r.roots;
}

// The agent that forwards to `agent`, or -1 when the senders feed it.
int32_t RelayParent(const Plan& plan, int32_t agent);
// The agents `agent` forwards to, by position.
std::vector<int32_t> RelayChildren(const Plan& plan, int32_t agent);

// Calls fn(const PlannedOp&) for every op `agent` sends as a sender: its executed ops
// (ForEachExecutedOp) whose destination is not fed by a relay.
template <typename Fn>
void ForEachSentOp(const Plan& plan, int32_t agent, Fn&& fn) {
  ForEachExecutedOp(plan, agent, [&](const PlannedOp& op) {
    if (!IsRelayed(plan, op.dst_agent)) fn(op);
  });
}

// The relay ops `agent` executes, for each child (by position) the same list: the byte ranges
// that the ops landing in `agent` (from any sender) write, data and FP8 scales, merged per
// region into contiguous runs cut at kRelayChunkBytes, by region then offset. `agents` are the
// plan's input layouts. Scans every sender's ops.
OpList RelayOps(const std::vector<AgentLayout>& agents, const Plan& plan, int32_t agent);
// RelayOps of every agent (indexed by agent; empty for agents without children) in one pass
// over the plan's ops. Holds every landed row range of the relays at once: meant for plans of
// up to ~10^6 executed ops into relays (the controller's), not for Kimi-K2-scale plans.
std::vector<OpList> AllRelayOps(const std::vector<AgentLayout>& agents, const Plan& plan);

}  // namespace wb::planner
