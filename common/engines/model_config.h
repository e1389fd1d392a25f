// A Hugging Face config.json reduced to the fields that decide engine parameter layouts, for
// the families weightbeam knows (Llama / Mistral / Qwen2 / Qwen3 dense, Qwen3-MoE, DeepSeek-V3 /
// Kimi-K2).
// Parsed once; everything else (layouts, source tensors, dry-run plans) reads this struct.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wb::engines {

enum class Family {
  kDense,     // LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
  kMoe,       // Qwen3MoeForCausalLM
  kDeepseek,  // DeepseekV3ForCausalLM (DeepSeek-V3/R1, Kimi-K2): MLA + MoE
};

struct ModelConfig {
  std::string architecture;  // e.g. "Qwen3ForCausalLM"
  std::string model_type;    // e.g. "qwen3"
  Family family = Family::kDense;

  int64_t hidden = 0;
  int64_t intermediate = 0;  // dense MLP (and DeepSeek's first dense layers)
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // config.head_dim, else hidden / heads
  int64_t vocab = 0;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2 always; others when attention_bias
  bool qk_norm = false;   // Qwen3 / Qwen3-MoE per-head q_norm / k_norm

  // MoE (Qwen3-MoE and DeepSeek).
  int64_t experts = 0;
  int64_t moe_intermediate = 0;
  int64_t decoder_sparse_step = 1;       // Qwen3-MoE
  std::vector<int64_t> mlp_only_layers;  // Qwen3-MoE
  int64_t first_k_dense_replace = 0;     // DeepSeek
  int64_t moe_layer_freq = 1;            // DeepSeek
  int64_t shared_experts = 0;            // DeepSeek n_shared_experts
  bool router_bias = false;              // DeepSeek topk_method == "noaux_tc"

  // DeepSeek MLA; q_lora_rank 0 means none (V2-Lite style q_proj).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // quantization_config.weight_block_size, e.g. {128, 128}; empty when absent.
  std::vector<int64_t> weight_block_size;

  bool IsMoeLayer(int64_t layer) const;
};

// The limits of every config.json weightbeam turns into a layout (the agent's EngineLayout and
// SourceLayout, wbctl, the dry run, the client helpers all parse through ParseModelConfig):
// no size field above kMaxConfigSize, and no model whose layouts could hold more than
// kMaxConfigTensors tensors (TensorBound). Real models stay far below both (DeepSeek-V3 and
// Kimi-K2: under 150,000 tensors with FP8 scales); past them a request is refused naming the
// field and the limit instead of looping or allocating without end.
inline constexpr int64_t kMaxConfigSize = int64_t{1} << 20;
inline constexpr uint64_t kMaxConfigTensors = uint64_t{1} << 20;

// An upper bound on the tensors of any layout of `config` (engine parameters, FP8 scales and
// Hugging Face sources alike).
uint64_t TensorBound(const ModelConfig& config);

// Parses config.json text. `source` names the file in errors ("config.json: ..."). An unknown
// architecture, a missing, non-positive or too large size field is one error naming the key;
// so is a model past kMaxConfigTensors.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json, absl::string_view source);

// Reads and parses a config.json file.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

const char* FamilyName(Family family);

}  // namespace wb::engines
