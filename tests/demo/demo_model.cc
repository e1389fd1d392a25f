#include "tests/demo/demo_model.h"

namespace wb::demo {

Qwen3Shape DemoQwen3(const DemoShape& shape) {
  Qwen3Shape s;  // Qwen3-0.6B
  s.layers = shape.layers;
  s.fp8 = !shape.bf16;
  return s;
}

absl::StatusOr<engines::ModelConfig> DemoConfig(const DemoShape& shape) {
  return engines::ParseModelConfig(Qwen3ConfigJson(DemoQwen3(shape)), "qwen3-0.6b config.json");
}

}  // namespace wb::demo
