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

namespace wb::planner {

struct PlanOptions {
  std::vector<RenameRule> renames;  // applied to source names, first match wins
  std::vector<FusionRule> fusions;
  CostModel cost;
  // Destinations under "layers.N." go to phase N / layers_per_phase; all other tensors
  // (embeddings, final norm, lm_head) to phase 0. Phases are separated by barriers.
  int layers_per_phase = 8;
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
  int16_t phase = 0;
  int16_t rail = 0;  // index into the sender's NICs
  // DType / Transform values, narrowed so that an op stays at 88 bytes.
  uint8_t src_dtype = 0;
  uint8_t dst_dtype = 0;
  uint8_t transform = 0;

  DType SrcDType() const { return static_cast<DType>(src_dtype); }
  DType DstDType() const { return static_cast<DType>(dst_dtype); }
  Transform GetTransform() const { return static_cast<Transform>(transform); }
  // Bytes landing at the destination: data plus, for FP8, the block scales.
  uint64_t DstBytes() const;
};

// One sender's ops, in execution order.
using OpList = std::vector<PlannedOp>;

// Bytes and ops per agent (as sender and as receiver), per device, and the cost model's view.
struct PlanStats {
  std::vector<uint64_t> send_bytes, send_ops, recv_bytes, recv_ops;  // per input agent
  std::vector<bool> is_sender, is_receiver;  // holds source / destination tensors
  // Per device (agent, GPU or host) that holds source (destination) tensors.
  std::vector<uint64_t> sender_device_bytes, receiver_device_bytes;
  uint64_t total_bytes = 0;
  uint64_t total_ops = 0;
  double sender_imbalance = 0;         // max / mean over sending agents
  double receiver_imbalance = 0;       // max / mean over receiving agents
  double sender_device_imbalance = 0;  // max / mean over sending devices
  double predicted_step_seconds = 0;   // max over senders' and receivers' rails
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
};

// Plans the transfer of every destination (inference) tensor from the source (trainer)
// tensors. On invalid input returns InvalidArgument listing every problem found, one per line.
// The plan refers to `agents` by index: keep them to read names/regions (plan_proto.h).
absl::StatusOr<Plan> BuildPlan(const std::vector<AgentLayout>& agents, const PlanOptions& options);

}  // namespace wb::planner
