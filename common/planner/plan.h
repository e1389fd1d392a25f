// The static transfer planner: a pure function from the agents' layouts (layout.h) to a plan,
// an ordered list of transfer operations per sending agent plus statistics and a cost
// prediction. No I/O, no clock: the same input always gives the same plan and hash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/planner/cost_model.h"
#include "common/planner/layout.h"
#include "common/planner/name_rules.h"
#include "common/planner/relay_options.h"

namespace wb::planner {

struct PlanOptions {
  std::vector<RenameRule> renames;  // applied to source names, first match wins
  std::vector<FusionRule> fusions;
  CostModel cost;
  // Destinations under "layers.N." go to phase N / layers_per_phase; all other tensors
  // (embeddings, final norm, lm_head) to phase 0. Phases are separated by barriers.
  int layers_per_phase = 8;
  // Destination entries with the same geometry (the same slice of the same tensor at the same
  // place of an identically shaped buffer: typically one rank in every inference replica) share
  // one op that lists them all (Plan::fanouts), so the plan holds one op per source slice and
  // destination class instead of one per receiver. false: one op per destination entry, as
  // before (the byte-comparison test plans both ways). Executed ops, bytes, statistics and the
  // cost model are the same either way; only the plan's memory and the time to build it drop.
  // Tensor-parallel siblings (the same rows, other columns) join one op too when their source
  // slices hold whole rows on one holder each: each reads its own columns (src_shift).
  bool fan_out = true;
  // Threads for generating ops (the same plan for any count); 0: the machine's cores, at
  // most 8.
  int threads = 0;
  // Relays (relay.h), off by default.
  RelayOptions relays;
};

// One operation: `rows` runs of `row_elems` elements read from the sender's tensor at
// `src_offset` (+ `src_stride` bytes per row) and written to the receiver's tensor at
// `dst_offset` (+ `dst_stride` per row). Agents and tensors are indices into the input
// vector<AgentLayout> (agent) and that agent's `tensors`, so an op holds no strings.
struct PlannedOp {
  uint64_t src_offset = 0;
  uint64_t src_stride = 0;
  uint64_t dst_offset = 0;
  uint64_t dst_stride = 0;
  uint64_t rows = 0;
  uint64_t row_elems = 0;
  // FP8_BLOCK only: the covered blocks' float32 scales go to `scale_tensor` of the receiver at
  // `scale_offset`, one row of scales every `scale_stride` bytes.
  uint64_t scale_offset = 0;
  uint32_t scale_stride = 0;
  int32_t src_agent = -1;
  int32_t src_tensor = -1;
  int32_t dst_agent = -1;
  int32_t dst_tensor = -1;
  int32_t scale_tensor = -1;
  // -1: the op has one destination (dst_agent, dst_tensor, scale_tensor). Else an index into
  // Plan::fanouts: the op is executed once per destination listed there (the first one being
  // dst_agent / dst_tensor / scale_tensor), at the same offsets.
  int32_t fanout = -1;
  int16_t phase = 0;
  int16_t rail = 0;  // index into the sender's NICs
  // DType / Transform values, narrowed: an op is 96 bytes, and Kimi-K2 TP 8 holds 11.1 M.
  uint8_t src_dtype = 0;
  uint8_t dst_dtype = 0;
  uint8_t transform = 0;
  // A relay op (relay.h): the sender forwards a run of bytes that landed in one of its own
  // destination regions (src = dst = that region's first entry, U8 elements, region offsets) to
  // the same region of another replica.
  uint8_t relay = 0;

  DType SrcDType() const { return static_cast<DType>(src_dtype); }
  DType DstDType() const { return static_cast<DType>(dst_dtype); }
  Transform GetTransform() const { return static_cast<Transform>(transform); }
  // Bytes landing at the destination: data plus, for FP8, the block scales.
  uint64_t DstBytes() const;
};

static_assert(sizeof(PlannedOp) <= 96, "plans hold millions of ops: keep an op small");

// One sender's ops, in execution order.
using OpList = std::vector<PlannedOp>;

// One destination of a fan-out op: the receiving agent, its tensor and (FP8) scale tensor, and
// where its bytes start in the source relative to the op's: 0 for a replica of the first
// destination; for a tensor-parallel sibling (the same rows, other columns of a source that
// holds whole rows) the column distance in source bytes.
struct Destination {
  int32_t agent = -1;
  int32_t tensor = -1;
  int32_t scale_tensor = -1;
  int32_t src_shift = 0;
};

// Bytes and ops per agent (as sender and as receiver), per device, and the cost model's view.
struct PlanStats {
  std::vector<uint64_t> send_bytes, send_ops, recv_bytes, recv_ops;  // per input agent
  std::vector<bool> is_sender, is_receiver;  // holds source / destination tensors
  // Per device (agent, GPU or host) that holds source (destination) tensors.
  std::vector<uint64_t> sender_device_bytes, receiver_device_bytes;
  // Bytes each device sends, by identity: agent a's GPU g is device_send_bytes[
  // agent_device_base[a] + g + 1] (slot agent_device_base[a] is its host memory). For reports
  // that group senders by what they hold (pipeline stages, data-parallel copies).
  std::vector<uint64_t> device_send_bytes;
  std::vector<int32_t> agent_device_base;
  uint64_t total_bytes = 0;
  uint64_t total_ops = 0;              // executed ops: a fan-out op counts once per destination
  uint64_t plan_ops = 0;               // ops held in the plan (PlannedOp entries)
  double sender_imbalance = 0;         // max / mean over sending agents
  double receiver_imbalance = 0;       // max / mean over receiving agents
  double sender_device_imbalance = 0;  // max / mean over sending devices
  double predicted_step_seconds = 0;   // max over senders' and receivers' rails
  // The link limit: max over all rails (sending and receiving) of bytes / rate, with no
  // per-op overhead. The prediction can only approach it.
  double link_limit_seconds = 0;
};

// The relay tree of a plan (relay.h). Inference agents that hold the same entries (a template
// and its replica mirrors, layout.h) form a family, ordered by replica; in every family the
// members at positions < roots get their bytes from the senders and member q >= roots from
// the member at (q - roots) / fanout, which forwards what landed in it.
struct RelayTree {
  int32_t roots = 0;  // 0: no relays, every destination is fed by the senders
  int32_t fanout = 0;
  int32_t depth = 0;                 // relay levels below the roots (the longest chain)
  std::vector<int32_t> family_head;  // per input agent: its family's template (itself if none)
  std::vector<int32_t> family_pos;   // per input agent: its position in the family (0: head)
  std::vector<std::vector<int32_t>> families;  // per head: members by position (head first)
  // Predictions (seconds): the plan without relays, with them, and the receivers' link limit
  // (no relay can beat it: every receiver still takes its bytes once).
  double direct_predicted_seconds = 0;
  double predicted_seconds = 0;
  double receiver_limit_seconds = 0;
  double pipeline_delay_seconds = 0;  // per relay level: one chunk landing before it is forwarded
  std::vector<uint64_t> relay_send_bytes;  // per input agent: bytes it forwards
  std::vector<uint64_t> relay_send_ops;    // per input agent: relay ops it executes
  uint64_t relayed_bytes = 0;              // bytes sent by relays in all
  // RelayOptions::direct_fallback: PlanToProto also gives the senders their direct ops to the
  // relayed replicas, marked fallback.
  bool direct_fallback = false;
};

struct Plan {
  // Per input agent, the ops it sends in execution order (phase by phase, each phase ending
  // with a barrier); empty for agents that send nothing.
  std::vector<OpList> ops;
  std::vector<int32_t> agent_order;  // input agent indices sorted by name
  int32_t phases = 1;
  uint64_t hash = 0;
  std::string hash_hex;  // 16 hex digits
  PlanStats stats;
  // Fan-out op destinations: group g lists fanout_dsts[fanout_begin[g], fanout_begin[g + 1]).
  // Executed in canonical order (replica, rank, agent): ForEachDestination. When
  // fanout_mirrored[g], each listed destination stands for itself followed by the same tensor
  // on each of its agent's replica mirrors (`mirrors`): a template's destination is listed once
  // instead of once per replica.
  std::vector<uint32_t> fanout_begin;
  std::vector<Destination> fanout_dsts;
  std::vector<uint8_t> fanout_mirrored;  // per group
  std::vector<uint32_t> fanout_size;     // per group: destinations executed
  // Per input agent: the agents that are its replica mirrors (layout.h), in canonical order.
  std::vector<std::vector<int32_t>> mirrors;
  // PlanOptions::relays: who forwards to whom (roots == 0: nobody). The ops above are the
  // plan without relays; relay.h gives what senders send and what relays forward.
  RelayTree relay;
};

// Calls fn(const Destination&) for each destination of fan-out group `g`, in execution order.
template <typename Fn>
void ForEachDestination(const Plan& plan, int32_t g, Fn&& fn) {
  const bool mirrored = plan.fanout_mirrored[g] != 0;
  for (uint32_t i = plan.fanout_begin[g]; i < plan.fanout_begin[g + 1]; ++i) {
    const Destination& d = plan.fanout_dsts[i];
    fn(d);
    if (!mirrored) continue;
    Destination copy = d;
    for (int32_t m : plan.mirrors[d.agent]) {
      copy.agent = m;
      fn(static_cast<const Destination&>(copy));
    }
  }
}

// Calls fn(const PlannedOp&) for every op `agent` executes, in execution order: each fan-out
// op once per destination, with dst_agent / dst_tensor / scale_tensor set to that destination,
// src_offset shifted by its src_shift, and fanout = -1. This is the per-destination plan the
// executor runs.
template <typename Fn>
void ForEachExecutedOp(const Plan& plan, int32_t agent, Fn&& fn) {
  for (const PlannedOp& op : plan.ops[agent]) {
    if (op.fanout < 0) {
      fn(op);
      continue;
    }
    PlannedOp one = op;
    one.fanout = -1;
    ForEachDestination(plan, op.fanout, [&](const Destination& d) {
      one.dst_agent = d.agent;
      one.dst_tensor = d.tensor;
      one.scale_tensor = d.scale_tensor;
      one.src_offset = op.src_offset + d.src_shift;
      fn(static_cast<const PlannedOp&>(one));
    });
  }
}

// The ops `agent` executes, one per destination (ForEachExecutedOp into a vector).
OpList ExecutedOps(const Plan& plan, int32_t agent);

// Plans the transfer of every destination (inference) tensor from the source (trainer)
// tensors. On invalid input returns InvalidArgument listing every problem found, one per line.
// The plan refers to `agents` by index: keep them to read names/regions (plan_proto.h).
absl::StatusOr<Plan> BuildPlan(const std::vector<AgentLayout>& agents, const PlanOptions& options);

}  // namespace wb::planner
