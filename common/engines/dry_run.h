// Planning from config.json without a cluster: the trainer layouts (FSDP dim-0 shards, or
// Megatron-core ranks from trainer_layout.h, every data-parallel copy a source) and the
// inference layouts (every rank's engine parameters as views, from EngineLayout) of a whole
// deployment, ready for the planner. Used by `wbctl plan --dry-run` and plan_bench --model.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/engines/engine_layout.h"
#include "common/engines/trainer_layout.h"
#include "common/planner/layout.h"
#include "common/planner/plan.h"

namespace wb::engines {

enum class TrainerDialect { kFsdp, kMegatron };

// absl::StatusOr of "fsdp" / "megatron".
absl::StatusOr<TrainerDialect> ParseTrainerDialect(absl::string_view name);

struct DeploymentOptions {
  Engine engine = Engine::kVllm;
  TrainerDialect trainer = TrainerDialect::kFsdp;
  int trainers = 8;  // training GPUs, one FSDP group (Megatron: set to tp x pp x dp)
  // Megatron: tp, pp, ep, etp, dp sizes (the ranks are ignored). Global rank (d * pp + p) * tp
  // + t; its expert ranks regroup a stage's tp x dp ranks as etp (fastest), ep, expert-dp.
  MegatronOptions megatron;
  std::vector<int64_t> stage_layer_counts;  // megatron: layers per stage; empty: uniform
  int inference_gpus = 8;                   // inference_gpus / tp engine replicas
  int tp = 8;
  // vLLM: ep = dp * tp (ep / tp replicas form one EP group); SGLang: ep divides tp.
  int ep = 1;
  bool fp8 = false;
  int64_t align_rows = 128;  // trainer shard boundaries (FP8 blocks never span two trainers)
  // FSDP with FP8 destinations: a tensor of fewer align_rows blocks than trainers is held whole
  // by one trainer (engines::FsdpRows `whole_small`), so a row-parallel destination shard of it
  // (DeepSeek-V3's experts' down_proj under TP 16: 7168 x 128) is one op of many 128x128 tiles
  // instead of one op per tile. false: cut block by block, as BF16 destinations are.
  bool fp8_whole_small = true;
  // Inference agents that repeat an earlier agent for shifted replicas are made its mirrors
  // (planner/layout.h) as they are laid out, never held in full: DeepSeek-V3 on 128 GPUs then
  // peaks at the template replica's 1.4 M entries instead of 11.6 M. Same plan, hash for hash;
  // false: every entry held (FoldMirrors can fold them afterwards).
  bool mirror_replicas = false;
  int gpus_per_agent = 8;
  int nics_per_agent = 8;
  double nic_gbps = 50;
};

// Agents "trainer-NNN" (one per gpus_per_agent training GPUs) and "infer-NNN". Errors: the
// model config's and EngineLayout's, or GPU counts that do not divide.
absl::StatusOr<std::vector<planner::AgentLayout>> DeploymentLayouts(
    const ModelConfig& config, const DeploymentOptions& options);

// Bytes (landing at the destinations, FP8 scales included) and ops per sending NIC rail: what
// each sender sends itself (with relays, not what relays forward for it).
struct NicLoad {
  std::string agent;
  std::string nic;
  uint64_t bytes = 0;
  uint64_t ops = 0;
};
std::vector<NicLoad> SenderNicLoads(const std::vector<planner::AgentLayout>& agents,
                                    const planner::Plan& plan);

}  // namespace wb::engines
