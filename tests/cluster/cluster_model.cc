#include "tests/cluster/cluster_model.h"

#include "absl/strings/str_cat.h"

namespace wb::cluster {

absl::StatusOr<planner::DeepSeekV3Config> ModelConfig(const std::string& name, int layers) {
  if (layers < 2) return absl::InvalidArgumentError("--layers must be at least 2 (1 dense + MoE)");
  // Kimi-K2 (DeepSeek-V3 architecture) divided down; every dimension a multiple of 128 x the
  // ranks that split it, so FP8 blocks and TP/EP shards come out even.
  planner::DeepSeekV3Config c;
  c.layers = layers;
  c.dense_layers = 1;
  c.shared_experts = 1;
  c.heads = 16;                                                         // K2: 64
  c.qk_nope_head_dim = 64, c.qk_rope_head_dim = 32, c.v_head_dim = 64;  // K2: 128, 64, 128
  c.q_lora_rank = 384, c.kv_lora_rank = 128;                            // K2: 1536, 512
  if (name == "k2-mini") {
    c.hidden = 1024, c.intermediate = 2048, c.experts = 32, c.moe_intermediate = 256;
    c.vocab = 16384;
  } else if (name == "k2-tiny") {
    c.hidden = 1024, c.intermediate = 1024, c.experts = 8, c.moe_intermediate = 256;
    c.vocab = 4096;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model ", name, " (known: k2-mini, k2-tiny)"));
  }
  return c;
}

absl::StatusOr<ClusterModel> BuildClusterModel(const ClusterShape& shape) {
  auto cfg = ModelConfig(shape.model, shape.layers);
  if (!cfg.ok()) return cfg.status();
  planner::TrainerOptions trainer;
  if (shape.trainer_replicas < 1 || shape.trainer_nodes % shape.trainer_replicas != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--trainer-replicas ", shape.trainer_replicas,
                                                   " must divide the trainer nodes (",
                                                   shape.trainer_nodes, ")"));
  }
  trainer.ranks = shape.trainer_ranks();
  trainer.replicas = shape.trainer_replicas;
  // Expert parallel across the nodes of one copy.
  trainer.ep = shape.trainer_nodes / shape.trainer_replicas;
  trainer.gpus_per_agent = shape.gpus_per_node;
  planner::InferenceOptions inference;
  inference.gpus = shape.inference_nodes * shape.gpus_per_node;
  inference.tp = shape.inference_tp();
  inference.ep = 2;
  inference.gpus_per_agent = shape.gpus_per_node;
  return demo::LayOut(planner::BuildDeepSeekV3(shape.model, *cfg), trainer, inference);
}

int TrainerReplica(const ClusterShape& shape, int rank) {
  return rank / (shape.trainer_ranks() / shape.trainer_replicas);
}

std::vector<planner::TensorEntry> TrainerEntries(const ClusterModel& m, const ClusterShape& shape,
                                                 int rank) {
  return demo::EntriesOf(m, planner::Role::kTrainer, TrainerReplica(shape, rank), rank);
}

std::vector<planner::TensorEntry> InferenceEntries(const ClusterModel& m, int replica, int rank) {
  return demo::EntriesOf(m, planner::Role::kInference, replica, rank);
}

std::vector<uint64_t> InferenceNodeBytes(const ClusterModel& m, const ClusterShape& shape) {
  std::vector<uint64_t> out(shape.inference_nodes, 0);
  const int tp = shape.inference_tp();
  for (const auto& agent : m.layouts) {
    for (const auto& t : agent.tensors) {
      if (t.owner.role != planner::Role::kInference) continue;
      const int gpu = t.owner.replica * tp + t.owner.rank;
      out[gpu / shape.gpus_per_node] += EntryBytes(t);
    }
  }
  return out;
}

}  // namespace wb::cluster
