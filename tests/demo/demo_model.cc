#include "tests/demo/demo_model.h"

namespace wb::demo {

absl::StatusOr<DemoModel> BuildDemoModel(const DemoShape& shape) {
  planner::Qwen3Config cfg = planner::Qwen3_0_6B();
  cfg.layers = shape.layers;
  planner::TrainerOptions trainer;
  trainer.ranks = shape.trainers;
  trainer.gpus_per_agent = shape.trainers;
  planner::InferenceOptions inference;
  inference.gpus = shape.tp;
  inference.tp = shape.tp;
  inference.gpus_per_agent = shape.tp;
  return LayOut(planner::BuildQwen3("qwen3-0.6b", cfg), trainer, inference);
}

std::vector<planner::TensorEntry> EntriesFor(const DemoModel& model, planner::Role role, int rank) {
  return EntriesOf(model, role, 0, rank);
}

}  // namespace wb::demo
