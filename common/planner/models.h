// Known model shapes (Qwen3-0.6B, Qwen3-235B-A22B, Kimi-K2) with Hugging Face tensor names,
// and generators of trainer (FSDP, BF16) and inference (TP/EP replicas, FP8) layouts for
// them, so tests and benchmarks can plan at full scale without any cluster.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/planner/layout.h"
#include "common/planner/name_rules.h"

namespace wb::planner {

// How inference ranks of one replica split a tensor (tensor parallelism).
enum class TpStyle { kReplicated, kColumn /* dim 0 */, kRow /* dim 1 */ };

struct ModelTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = weightbeam::v1::DTYPE_BF16;  // as trained
  TpStyle tp = TpStyle::kReplicated;
  bool fp8 = false;  // FP8 block-scaled on the inference side (large 2-D linear weights)
  int expert = -1;   // routed expert index, else -1
};

struct ModelSpec {
  std::string name;
  int num_experts = 0;
  std::vector<ModelTensor> tensors;
  uint64_t Params() const;
};

struct Qwen3Config {
  int hidden = 1024, layers = 28, heads = 16, kv_heads = 8, head_dim = 128;
  int intermediate = 3072, vocab = 151936;
  bool tied_embeddings = true;
  int experts = 0, moe_intermediate = 0;  // experts > 0: every layer is MoE
};
struct DeepSeekV3Config {
  int hidden = 7168, layers = 61, dense_layers = 1, intermediate = 18432;
  int experts = 384, shared_experts = 1, moe_intermediate = 2048, heads = 64;
  int q_lora_rank = 1536, kv_lora_rank = 512, qk_nope_head_dim = 128, qk_rope_head_dim = 64;
  int v_head_dim = 128, vocab = 163840;
};

Qwen3Config Qwen3_0_6B();
Qwen3Config Qwen3_235B_A22B();
DeepSeekV3Config KimiK2();
ModelSpec BuildQwen3(const std::string& name, const Qwen3Config& c);
ModelSpec BuildDeepSeekV3(const std::string& name, const DeepSeekV3Config& c);
// "qwen3-0.6b", "qwen3-235b", "kimi-k2".
absl::StatusOr<ModelSpec> ModelByName(const std::string& name);

struct TrainerOptions {
  int ranks = 8;     // training GPUs
  int replicas = 1;  // data-parallel replicas (HSDP): each holds the whole model
  int ep = 1;        // expert parallel groups within a replica
  int gpus_per_agent = 8;
  int nics_per_agent = 8;
  double nic_gbps = 50;
};

struct InferenceOptions {
  int gpus = 8;  // replicas = gpus / tp
  int tp = 8;
  int ep = 1;  // expert-parallel groups within a replica; must divide tp
  bool fp8 = true;
  std::vector<FusionRule> fusions = DefaultFusionRules();
  int gpus_per_agent = 8;
  int nics_per_agent = 8;
  double nic_gbps = 50;
  // Build one period of nodes and replicas (lcm(tp, gpus_per_agent) GPUs) and make every later
  // node a mirror of its counterpart there (layout.h Mirror): the same plan, hash for hash,
  // with one replica's entries held instead of all of them.
  bool mirror_replicas = false;
};

// Trainer side: each tensor split in near-equal dim-0 slices aligned to 128 rows over the
// ranks of its group (all ranks of a replica, or the expert's EP group); when a tensor has
// fewer 128-row blocks than ranks, whole blocks go round-robin (a rotating start balances
// ranks across tensors). One agent per `gpus_per_agent` GPUs, one NIC rail per GPU.
// Inference side: replicas of `tp` ranks; column/row parallel tensors sliced on dim 0/1
// (replicated when they have fewer 128-blocks than ranks), routed experts split across `ep`
// groups, fusion rules applied (qkv_proj, gate_up_proj), FP8 + `weight_scale_inv` for the
// large linear weights when `fp8`.
absl::StatusOr<std::vector<AgentLayout>> BuildLayouts(const ModelSpec& model,
                                                      const TrainerOptions& trainer,
                                                      const InferenceOptions& inference);

}  // namespace wb::planner
