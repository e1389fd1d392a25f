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

uint64_t EntryElements(const planner::TensorEntry& e) {
  uint64_t n = 1;
  if (e.shard.empty()) {
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
  } else {
    for (const auto& s : e.shard) n *= static_cast<uint64_t>(s.size);
  }
  return n;
}

uint64_t EntryBytes(const planner::TensorEntry& e) {
  return EntryElements(e) * static_cast<uint64_t>(planner::DTypeBytes(e.dtype));
}

}  // namespace wb::demo
