#include "common/engines/engine_layout_proto.h"

#include "absl/strings/str_cat.h"
#include "common/engines/engine_layout.h"

namespace wb::engines {

namespace v1 = weightbeam::v1;

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
    for (const ParamPart& part : p.parts) {
      v1::EngineParamPart* q = o->add_parts();
      q->set_source(part.source);
      q->mutable_source_shape()->Add(part.source_shape.begin(), part.source_shape.end());
      for (const DimSlice& s : part.box) {
        v1::DimSlice* b = q->add_box();
        b->set_start(s.start);
        b->set_size(s.size);
      }
      q->mutable_offset()->Add(part.offset.begin(), part.offset.end());
    }
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
  const std::vector<int> first_ranks = FsdpFirstRanks(sources, req.world(), req.align_rows());
  for (size_t i = 0; i < sources.size(); ++i) {
    const SourceTensor& t = sources[i];
    v1::SourceShard* o = out.add_tensors();
    o->set_name(t.name);
    o->set_dtype(t.dtype);
    o->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    DimSlice rows = FsdpRows(t.shape[0], req.world(), req.rank(), req.align_rows(), first_ranks[i]);
    o->mutable_rows()->set_start(rows.start);
    o->mutable_rows()->set_size(rows.size);
  }
  return out;
}

}  // namespace wb::engines
