// The demo's model: Qwen3-0.6B's shape (optionally fewer layers) as a Hugging Face config.json
// with FP8 block quantisation. Trainer ranks hold its HF tensors as FSDP dim-0 shards
// (torch.chunk) in BF16; one inference replica of TP ranks holds vLLM's parameters (fused
// qkv_proj / gate_up_proj per rank, FP8 linears with their scales, BF16 norms and embeddings),
// registered through the engine layouts (client/weightbeam/engines.h).
#pragma once

#include "absl/status/statusor.h"
#include "common/engines/model_config.h"
#include "tests/demo/expected_layout.h"

namespace wb::demo {

struct DemoShape {
  int layers = 28;
  int trainers = 4;
  int tp = 2;
  bool bf16 = false;  // the replica holds BF16 parameters (no FP8 quantization_config)
};

// Qwen3-0.6B's sizes with `shape.layers` decoder layers.
Qwen3Shape DemoQwen3(const DemoShape& shape);

// DemoQwen3's config.json, parsed as the engine layouts read it.
absl::StatusOr<engines::ModelConfig> DemoConfig(const DemoShape& shape);

}  // namespace wb::demo
