#include "tests/demo/demo_model.h"

namespace wb::demo {

absl::StatusOr<DemoModel> BuildDemoModel(const DemoShape& shape) {
  planner::Qwen3Config cfg = planner::Qwen3_0_6B();
  cfg.layers = shape.layers;
  DemoModel m;
  m.spec = planner::BuildQwen3("qwen3-0.6b", cfg);
  planner::TrainerOptions trainer;
  trainer.ranks = shape.trainers;
  trainer.gpus_per_agent = shape.trainers;
  trainer.nics_per_agent = 1;
  planner::InferenceOptions inference;
  inference.gpus = shape.tp;
  inference.tp = shape.tp;
  inference.gpus_per_agent = shape.tp;
  inference.nics_per_agent = 1;
  inference.fp8 = true;
  auto layouts = planner::BuildLayouts(m.spec, trainer, inference);
  if (!layouts.ok()) return layouts.status();
  m.layouts = std::move(*layouts);
  return m;
}

std::vector<planner::TensorEntry> EntriesFor(const DemoModel& model, planner::Role role, int rank) {
  std::vector<planner::TensorEntry> out;
  for (const auto& agent : model.layouts) {
    for (const auto& t : agent.tensors) {
      if (t.owner.role == role && t.owner.rank == rank && t.owner.replica == 0) out.push_back(t);
    }
  }
  return out;
}

}  // namespace wb::demo
