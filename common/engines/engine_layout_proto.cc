#include "common/engines/engine_layout_proto.h"

#include "absl/strings/str_cat.h"
#include "common/engines/engine_layout.h"
#include "common/engines/trainer_layout.h"

namespace wb::engines {

namespace v1 = weightbeam::v1;

namespace {

void SetPart(const ParamPart& part, v1::EngineParamPart* q) {
  q->set_source(part.source);
  q->mutable_source_shape()->Add(part.source_shape.begin(), part.source_shape.end());
  for (const DimSlice& s : part.box) {
    v1::DimSlice* b = q->add_box();
    b->set_start(s.start);
    b->set_size(s.size);
  }
  q->mutable_offset()->Add(part.offset.begin(), part.offset.end());
}

int OneIfZero(int v) { return v == 0 ? 1 : v; }

}  // namespace

absl::StatusOr<v1::EngineLayoutResponse> AnswerEngineLayout(const v1::EngineLayoutRequest& req) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(req.config_json(), "config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<Engine> engine = ParseEngine(req.engine());
  if (!engine.ok()) return engine.status();
  EngineOptions options;
  options.engine = *engine;
  options.tp = req.tp();
  options.tp_rank = req.tp_rank();
  options.ep = req.ep() <= 0 ? 1 : req.ep();
  options.ep_rank = req.ep_rank();
  options.fp8 = req.fp8();
  absl::StatusOr<std::vector<EngineParam>> params = EngineLayout(*config, options);
  if (!params.ok()) return params.status();
  v1::EngineLayoutResponse out;
  for (const EngineParam& p : *params) {
    v1::EngineParam* o = out.add_params();
    o->set_name(p.name);
    o->set_dtype(p.dtype);
    o->mutable_shape()->Add(p.shape.begin(), p.shape.end());
    o->set_scale_of(p.scale_of);
    for (const ParamPart& part : p.parts) SetPart(part, o->add_parts());
  }
  return out;
}

absl::StatusOr<v1::SourceLayoutResponse> AnswerSourceLayout(const v1::SourceLayoutRequest& req) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(req.config_json(), "config.json");
  if (!config.ok()) return config.status();
  if (req.world() < 1 || req.rank() < 0 || req.rank() >= req.world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer rank ", req.rank(), " is not in [0, world ", req.world(), ")"));
  }
  v1::SourceLayoutResponse out;
  const std::vector<SourceTensor> sources = SourceTensors(*config);
  const std::vector<int> first_ranks =
      FsdpFirstRanks(sources, req.world(), req.align_rows(), req.whole_small());
  for (size_t i = 0; i < sources.size(); ++i) {
    const SourceTensor& t = sources[i];
    v1::SourceShard* o = out.add_tensors();
    o->set_name(t.name);
    o->set_dtype(t.dtype);
    o->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    DimSlice rows = FsdpRows(t.shape[0], req.world(), req.rank(), req.align_rows(), first_ranks[i],
                             req.whole_small());
    o->mutable_rows()->set_start(rows.start);
    o->mutable_rows()->set_size(rows.size);
  }
  return out;
}

absl::StatusOr<v1::TrainerLayoutResponse> AnswerTrainerLayout(const v1::TrainerLayoutRequest& req) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(req.config_json(), "config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<std::vector<TrainerTensor>> tensors;
  if (req.has_megatron()) {
    const v1::MegatronParallel& m = req.megatron();
    MegatronOptions o;
    o.tp = OneIfZero(m.tp()), o.tp_rank = m.tp_rank();
    o.pp = OneIfZero(m.pp()), o.pp_rank = m.pp_rank();
    o.ep = OneIfZero(m.ep()), o.ep_rank = m.ep_rank();
    o.etp = OneIfZero(m.etp()), o.etp_rank = m.etp_rank();
    o.dp = OneIfZero(m.dp()), o.dp_rank = m.dp_rank();
    o.stage_layers_given = m.stage_layers_given();
    o.stage_layers.assign(m.stage_layers().begin(), m.stage_layers().end());
    o.vocab_divisible_by = m.vocab_divisible_by() == 0 ? 128 : m.vocab_divisible_by();
    o.sequential_experts = m.sequential_experts();
    tensors = MegatronLayout(*config, o);
  } else if (req.has_dtensor()) {
    const v1::DTensorMesh& d = req.dtensor();
    DTensorOptions o;
    o.mesh.assign(d.mesh().begin(), d.mesh().end());
    o.coords.assign(d.coords().begin(), d.coords().end());
    o.fused_experts = d.fused_experts();
    for (const v1::PlacementRule& r : d.rules()) {
      absl::StatusOr<std::vector<Placement>> p = ParsePlacements(r.placements());
      if (!p.ok()) return p.status();
      o.rules.push_back({r.pattern(), *std::move(p)});
    }
    tensors = DTensorLayout(*config, o);
  } else {
    return absl::InvalidArgumentError("trainer layout: give megatron or dtensor settings");
  }
  if (!tensors.ok()) return tensors.status();
  v1::TrainerLayoutResponse out;
  for (const TrainerTensor& t : *tensors) {
    v1::TrainerTensor* o = out.add_tensors();
    o->set_name(t.name);
    o->set_dtype(t.dtype);
    o->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    for (const ParamPart& part : t.parts) SetPart(part, o->add_parts());
  }
  return out;
}

}  // namespace wb::engines
