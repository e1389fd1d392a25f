#include "common/engines/trainer_layout.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace wb::engines {
namespace {

namespace v1 = weightbeam::v1;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::Status Refuse(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::Status CheckRank(const char* what, int size, int rank) {
  if (size < 1 || size > kMaxLayoutParallel || rank < 0 || rank >= size) {
    return Refuse(absl::StrCat(what, "_rank ", rank, " is not in [0, ", what, " ", size, ") (",
                               what, " must be 1 to ", kMaxLayoutParallel, ")"));
  }
  return absl::OkStatus();
}

// Collects tensors and their parts; source shapes come from SourceTensors.
class TensorList {
 public:
  explicit TensorList(const ModelConfig& c) {
    for (const SourceTensor& s : SourceTensors(c)) shapes_[s.name] = s.shape;
  }

  const std::vector<int64_t>& Shape(const std::string& source) { return shapes_[source]; }

  TrainerTensor& Add(std::string name, std::vector<int64_t> shape, DType dtype = v1::DTYPE_BF16) {
    out_.push_back(TrainerTensor{std::move(name), dtype, std::move(shape), {}});
    return out_.back();
  }

  void Part(TrainerTensor& t, const std::string& source, std::vector<DimSlice> box,
            std::vector<int64_t> offset) {
    t.parts.push_back(ParamPart{source, Shape(source), std::move(box), std::move(offset)});
  }

  // The whole HF tensor `source` as trainer tensor `name`.
  void Whole(const std::string& name, const std::string& source, DType dtype = v1::DTYPE_BF16) {
    const std::vector<int64_t> shape = Shape(source);
    TrainerTensor& t = Add(name, shape, dtype);
    std::vector<DimSlice> box;
    for (int64_t d : shape) box.push_back({0, d});
    Part(t, source, box, std::vector<int64_t>(shape.size(), 0));
  }

  // Rows [r * n / k, (r + 1) * n / k) of a 2-D `source` (column-parallel).
  void Rows(const std::string& name, const std::string& source, int k, int r) {
    const std::vector<int64_t> s = Shape(source);
    const int64_t rows = s[0] / k;
    TrainerTensor& t = Add(name, {rows, s[1]});
    Part(t, source, {{r * rows, rows}, {0, s[1]}}, {0, 0});
  }

  // Columns [r * n / k, (r + 1) * n / k) of a 2-D `source` (row-parallel).
  void Columns(const std::string& name, const std::string& source, int k, int r) {
    const std::vector<int64_t> s = Shape(source);
    const int64_t cols = s[1] / k;
    TrainerTensor& t = Add(name, {s[0], cols});
    Part(t, source, {{0, s[0]}, {r * cols, cols}}, {0, 0});
  }

  // [gate rows of r; up rows of r] of `hf`gate_proj / up_proj.
  void GateUp(const std::string& name, const std::string& hf, int k, int r) {
    const std::vector<int64_t> s = Shape(hf + "gate_proj.weight");
    const int64_t rows = s[0] / k;
    TrainerTensor& t = Add(name, {2 * rows, s[1]});
    Part(t, hf + "gate_proj.weight", {{r * rows, rows}, {0, s[1]}}, {0, 0});
    Part(t, hf + "up_proj.weight", {{r * rows, rows}, {0, s[1]}}, {rows, 0});
  }

  std::vector<TrainerTensor> Take() { return std::move(out_); }

 private:
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::vector<TrainerTensor> out_;
};

// ---------------------------------------------------------------------------------------------
// Megatron-core

struct MegatronPlan {
  std::vector<int64_t> layers;  // global layer of each local index
  bool first = false;           // holds the embedding
  bool last = false;            // holds the final norm and output layer
  int64_t padded_vocab = 0;
  int64_t expert0 = 0, local_experts = 0;
};

absl::StatusOr<MegatronPlan> CheckMegatron(const ModelConfig& c, const MegatronOptions& o) {
  for (auto [what, size, rank] :
       {std::make_tuple("tp", o.tp, o.tp_rank), std::make_tuple("pp", o.pp, o.pp_rank),
        std::make_tuple("ep", o.ep, o.ep_rank), std::make_tuple("etp", o.etp, o.etp_rank),
        std::make_tuple("dp", o.dp, o.dp_rank)}) {
    if (absl::Status s = CheckRank(what, size, rank); !s.ok()) return s;
  }
  MegatronPlan plan;
  if (o.stage_layers_given) {
    for (size_t i = 0; i < o.stage_layers.size(); ++i) {
      const int64_t l = o.stage_layers[i];
      if (l < 0 || l >= c.layers || (i > 0 && l <= o.stage_layers[i - 1])) {
        return Refuse(absl::StrCat(
            "stage layers [", absl::StrJoin(o.stage_layers, ", "), "] of pp rank ", o.pp_rank,
            ": layer ", l, " is out of order or not in [0, num_hidden_layers ", c.layers, ")"));
      }
    }
    plan.layers = o.stage_layers;
    const bool has_first = plan.layers.empty() || plan.layers.front() == 0;
    const bool has_last = plan.layers.empty() || plan.layers.back() == c.layers - 1;
    plan.first = o.pp_rank == 0 && has_first;
    plan.last = o.pp_rank == o.pp - 1 && has_last;
  } else {
    if (c.layers % o.pp != 0) {
      return Refuse(absl::StrCat("pp ", o.pp, " does not divide num_hidden_layers ", c.layers,
                                 " (decoder.layers); give each stage's layers for an uneven "
                                 "split"));
    }
    const int64_t per = c.layers / o.pp;
    for (int64_t l = 0; l < per; ++l) plan.layers.push_back(o.pp_rank * per + l);
    plan.first = o.pp_rank == 0;
    plan.last = o.pp_rank == o.pp - 1;
  }
  if (c.heads % o.tp != 0) {
    return Refuse(absl::StrCat("tp ", o.tp, " does not divide num_attention_heads ", c.heads,
                               " (decoder.layers.0.self_attention)"));
  }
  if (c.family != Family::kDeepseek && c.kv_heads % o.tp != 0) {
    return Refuse(absl::StrCat("tp ", o.tp, " does not divide num_query_groups ", c.kv_heads,
                               " (num_key_value_heads; "
                               "decoder.layers.0.self_attention.linear_qkv.weight)"));
  }
  if (c.family != Family::kDeepseek && c.heads % c.kv_heads != 0) {
    return Refuse(absl::StrCat("num_key_value_heads ", c.kv_heads,
                               " does not divide num_attention_heads ", c.heads,
                               " (decoder.layers.0.self_attention.linear_qkv.weight)"));
  }
  // Bounded before any arithmetic: vocab_divisible_by x tp must not wrap (to 0: SIGFPE below).
  if (o.vocab_divisible_by < 1 || o.vocab_divisible_by > kMaxVocabDivisibleBy) {
    return Refuse(absl::StrCat("make_vocab_size_divisible_by ", o.vocab_divisible_by,
                               " must be 1 to ", kMaxVocabDivisibleBy,
                               " (embedding.word_embeddings.weight)"));
  }
  const int64_t multiple = o.vocab_divisible_by * o.tp;
  plan.padded_vocab = CeilDiv(c.vocab, multiple) * multiple;
  bool dense = false, moe = false;
  for (int64_t l : plan.layers) (c.IsMoeLayer(l) ? moe : dense) = true;
  if (dense && c.intermediate % o.tp != 0) {
    return Refuse(absl::StrCat("tp ", o.tp, " does not divide intermediate_size ", c.intermediate,
                               " (mlp.linear_fc1.weight)"));
  }
  if (c.experts > 0) {
    if (c.experts % o.ep != 0) {
      return Refuse(absl::StrCat("ep ", o.ep, " does not divide the ", c.experts,
                                 " experts (mlp.experts.linear_fc1.weight)"));
    }
    if (c.moe_intermediate % o.etp != 0) {
      return Refuse(absl::StrCat("etp ", o.etp, " does not divide moe_intermediate_size ",
                                 c.moe_intermediate, " (mlp.experts.linear_fc1.weight)"));
    }
    if (c.shared_experts > 0 && c.moe_intermediate * c.shared_experts % o.tp != 0) {
      return Refuse(absl::StrCat("tp ", o.tp, " does not divide the shared experts' intermediate ",
                                 c.moe_intermediate * c.shared_experts,
                                 " (mlp.shared_experts.linear_fc1.weight)"));
    }
    plan.local_experts = c.experts / o.ep;
    plan.expert0 = o.ep_rank * plan.local_experts;
  } else if (o.ep != 1 || o.etp != 1) {
    return Refuse(absl::StrCat("ep ", o.ep, " and etp ", o.etp, ": the model has no experts"));
  }
  (void)moe;
  return plan;
}

class MegatronBuilder {
 public:
  MegatronBuilder(const ModelConfig& c, const MegatronOptions& o, const MegatronPlan& p)
      : c_(c), o_(o), p_(p), list_(c) {}

  std::vector<TrainerTensor> Build() {
    if (p_.first) Vocab("embedding.word_embeddings.weight", "model.embed_tokens.weight");
    for (size_t l = 0; l < p_.layers.size(); ++l) Layer(static_cast<int64_t>(l), p_.layers[l]);
    if (p_.last) {
      list_.Whole("decoder.final_layernorm.weight", "model.norm.weight");
      if (!c_.tie_embeddings) {
        Vocab("output_layer.weight", "lm_head.weight");
      } else if (!p_.first) {
        // Tied, on a later stage than the embedding's: Megatron-core's last stage keeps its
        // own output_layer.weight, kept equal to the embedding by an all-reduce. A second
        // holder of the embedding's bytes (the planner may read either copy).
        Vocab("output_layer.weight", "model.embed_tokens.weight");
      }
    }
    return list_.Take();
  }

 private:
  // Rows of the vocab padded to a multiple of make_vocab_size_divisible_by x tp, split evenly;
  // rows past the real vocab are padding (no part).
  void Vocab(const std::string& name, const std::string& source) {
    const int64_t per = p_.padded_vocab / o_.tp;
    const int64_t start = std::min(o_.tp_rank * per, c_.vocab);
    const int64_t end = std::min((o_.tp_rank + 1) * per, c_.vocab);
    TrainerTensor& t = list_.Add(name, {per, c_.hidden});
    if (end > start) list_.Part(t, source, {{start, end - start}, {0, c_.hidden}}, {0, 0});
  }

  void Layer(int64_t local, int64_t global) {
    const std::string m = absl::StrCat("decoder.layers.", local, ".");
    const std::string h = absl::StrCat("model.layers.", global, ".");
    if (c_.family == Family::kDeepseek) {
      Mla(m, h);
    } else {
      Attention(m, h);
    }
    if (c_.IsMoeLayer(global)) {
      list_.Whole(m + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight");
      Experts(m + "mlp.", h + "mlp.");
      if (c_.family == Family::kDeepseek && c_.shared_experts > 0) {
        list_.GateUp(m + "mlp.shared_experts.linear_fc1.weight", h + "mlp.shared_experts.", o_.tp,
                     o_.tp_rank);
        list_.Columns(m + "mlp.shared_experts.linear_fc2.weight",
                      h + "mlp.shared_experts.down_proj.weight", o_.tp, o_.tp_rank);
      }
    } else {
      list_.Whole(m + "mlp.linear_fc1.layer_norm_weight", h + "post_attention_layernorm.weight");
      list_.GateUp(m + "mlp.linear_fc1.weight", h + "mlp.", o_.tp, o_.tp_rank);
      list_.Columns(m + "mlp.linear_fc2.weight", h + "mlp.down_proj.weight", o_.tp, o_.tp_rank);
    }
  }

  // linear_qkv: query groups [r * ng / tp, (r + 1) * ng / tp), each [its q heads; k_g; v_g].
  void Attention(const std::string& m, const std::string& h) {
    const std::string a = m + "self_attention.";
    const std::string s = h + "self_attn.";
    list_.Whole(a + "linear_qkv.layer_norm_weight", h + "input_layernorm.weight");
    const int64_t d = c_.head_dim, ng = c_.kv_heads / o_.tp, qpg = c_.heads / c_.kv_heads;
    const int64_t g0 = o_.tp_rank * ng, group_rows = (qpg + 2) * d;
    for (bool bias : {false, true}) {
      if (bias && !c_.qkv_bias) continue;
      const char* what = bias ? "bias" : "weight";
      std::vector<int64_t> shape = {ng * group_rows};
      if (!bias) shape.push_back(c_.hidden);
      TrainerTensor& t = list_.Add(absl::StrCat(a, "linear_qkv.", what), shape);
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t at = g * group_rows, gg = g0 + g;
        struct Piece {
          const char* proj;
          int64_t start, size, at;
        };
        const Piece pieces[] = {{"q_proj", gg * qpg * d, qpg * d, at},
                                {"k_proj", gg * d, d, at + qpg * d},
                                {"v_proj", gg * d, d, at + (qpg + 1) * d}};
        for (const Piece& p : pieces) {
          std::vector<DimSlice> box = {{p.start, p.size}};
          std::vector<int64_t> offset = {p.at};
          if (!bias) {
            box.push_back({0, c_.hidden});
            offset.push_back(0);
          }
          list_.Part(t, absl::StrCat(s, p.proj, ".", what), box, offset);
        }
      }
    }
    if (c_.qk_norm) {
      list_.Whole(a + "q_layernorm.weight", s + "q_norm.weight");
      list_.Whole(a + "k_layernorm.weight", s + "k_norm.weight");
    }
    list_.Columns(a + "linear_proj.weight", s + "o_proj.weight", o_.tp, o_.tp_rank);
  }

  // Multi-latent attention: down-projections replicated across TP, up-projections
  // column-parallel by heads (with their fused layer norms), linear_proj row-parallel.
  void Mla(const std::string& m, const std::string& h) {
    const std::string a = m + "self_attention.";
    const std::string s = h + "self_attn.";
    list_.Whole(m + "input_layernorm.weight", h + "input_layernorm.weight");
    if (c_.q_lora_rank > 0) {
      list_.Whole(a + "linear_q_down_proj.weight", s + "q_a_proj.weight");
      list_.Whole(a + "linear_q_up_proj.layer_norm_weight", s + "q_a_layernorm.weight");
      list_.Rows(a + "linear_q_up_proj.weight", s + "q_b_proj.weight", o_.tp, o_.tp_rank);
    } else {
      list_.Rows(a + "linear_q_proj.weight", s + "q_proj.weight", o_.tp, o_.tp_rank);
    }
    list_.Whole(a + "linear_kv_down_proj.weight", s + "kv_a_proj_with_mqa.weight");
    list_.Whole(a + "linear_kv_up_proj.layer_norm_weight", s + "kv_a_layernorm.weight");
    list_.Rows(a + "linear_kv_up_proj.weight", s + "kv_b_proj.weight", o_.tp, o_.tp_rank);
    list_.Columns(a + "linear_proj.weight", s + "o_proj.weight", o_.tp, o_.tp_rank);
  }

  // Router (+ expert_bias) and this EP rank's experts, each split over etp.
  void Experts(const std::string& m, const std::string& h) {
    list_.Whole(m + "router.weight", h + "gate.weight");
    if (c_.router_bias) {
      list_.Whole(m + "router.expert_bias", h + "gate.e_score_correction_bias", v1::DTYPE_F32);
    }
    for (int64_t j = 0; j < p_.local_experts; ++j) {
      const std::string e = absl::StrCat(h, "experts.", p_.expert0 + j, ".");
      std::string fc1, fc2;
      if (o_.sequential_experts) {
        fc1 = absl::StrCat(m, "experts.local_experts.", j, ".linear_fc1.weight");
        fc2 = absl::StrCat(m, "experts.local_experts.", j, ".linear_fc2.weight");
      } else {
        fc1 = absl::StrCat(m, "experts.linear_fc1.weight", j);
        fc2 = absl::StrCat(m, "experts.linear_fc2.weight", j);
      }
      list_.GateUp(fc1, e, o_.etp, o_.etp_rank);
      list_.Columns(fc2, e + "down_proj.weight", o_.etp, o_.etp_rank);
    }
  }

  const ModelConfig& c_;
  const MegatronOptions& o_;
  const MegatronPlan& p_;
  TensorList list_;
};

// ---------------------------------------------------------------------------------------------
// DTensor

// The local box of a tensor of `shape` under `placements`: plain shards in mesh order, then
// strided shards (TP-major FSDP + TP: the later mesh dims' cuts come first).
std::vector<DimSlice> LocalBox(const std::vector<int64_t>& shape,
                               const std::vector<Placement>& placements, const DTensorOptions& o) {
  std::vector<DimSlice> box;
  for (int64_t d : shape) box.push_back({0, d});
  auto cut = [&](size_t i) {
    DimSlice& s = box[static_cast<size_t>(placements[i].dim)];
    const DimSlice piece = ChunkRows(s.size, o.mesh[i], o.coords[i]);
    s = {s.start + piece.start, piece.size};
  };
  for (size_t i = 0; i < placements.size(); ++i) {
    if (placements[i].kind == Placement::Kind::kShard) cut(i);
  }
  for (size_t i = placements.size(); i-- > 0;) {
    if (placements[i].kind == Placement::Kind::kStridedShard) cut(i);
  }
  return box;
}

const std::vector<Placement>* RuleFor(const DTensorOptions& o, const std::string& name) {
  for (const PlacementRule& r : o.rules) {
    if (GlobMatch(r.pattern, name)) return &r.placements;
  }
  return nullptr;
}

absl::Status CheckDTensor(const ModelConfig& c, const DTensorOptions& o) {
  if (o.mesh.empty() || o.mesh.size() > 4 || o.coords.size() != o.mesh.size()) {
    return Refuse(absl::StrCat("mesh [", absl::StrJoin(o.mesh, ", "), "] and coordinates [",
                               absl::StrJoin(o.coords, ", "),
                               "] must have the same 1 to 4 dimensions"));
  }
  for (size_t i = 0; i < o.mesh.size(); ++i) {
    if (o.mesh[i] < 1 || o.mesh[i] > kMaxLayoutParallel || o.coords[i] < 0 ||
        o.coords[i] >= o.mesh[i]) {
      return Refuse(absl::StrCat("mesh coordinate ", o.coords[i], " is not in [0, ", o.mesh[i],
                                 ") on mesh dimension ", i));
    }
  }
  if (o.rules.size() > static_cast<size_t>(kMaxLayoutRules)) {
    return Refuse(absl::StrCat(o.rules.size(), " placement rules: at most ", kMaxLayoutRules));
  }
  for (const PlacementRule& r : o.rules) {
    if (r.pattern.size() > kMaxLayoutPattern) {
      return Refuse(absl::StrCat("placement rule pattern of ", r.pattern.size(),
                                 " characters: at most ", kMaxLayoutPattern));
    }
    if (r.placements.size() != o.mesh.size()) {
      return Refuse(absl::StrCat("placements '", FormatPlacements(r.placements), "' for '",
                                 r.pattern, "' name ", r.placements.size(),
                                 " mesh dimension(s); the mesh has ", o.mesh.size()));
    }
  }
  if (o.fused_experts && c.experts == 0) {
    return Refuse("fused experts (mlp.experts.gate_up_proj): the model has no experts");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLayoutSizes(const ModelConfig& c) {
  if (c.layers > kMaxLayoutLayers || c.experts > kMaxLayoutExperts || c.vocab > kMaxLayoutVocab) {
    return Refuse(absl::StrCat("config.json: ", c.layers, " layers, ", c.experts,
                               " experts and vocab ", c.vocab, ": a layout takes at most ",
                               kMaxLayoutLayers, " layers, ", kMaxLayoutExperts,
                               " experts and a vocab of ", kMaxLayoutVocab));
  }
  return absl::OkStatus();
}

bool FillsTensor(const TrainerTensor& t) {
  if (t.parts.size() != 1 || t.parts[0].box.size() != t.shape.size()) return false;
  const ParamPart& part = t.parts[0];
  for (size_t d = 0; d < part.box.size(); ++d) {
    if (part.offset[d] != 0 || part.box[d].size != t.shape[d]) return false;
  }
  return true;
}

absl::StatusOr<std::vector<TrainerTensor>> MegatronLayout(const ModelConfig& config,
                                                          const MegatronOptions& options) {
  if (absl::Status s = CheckLayoutSizes(config); !s.ok()) return s;
  absl::StatusOr<MegatronPlan> plan = CheckMegatron(config, options);
  if (!plan.ok()) return plan.status();
  return MegatronBuilder(config, options, *plan).Build();
}

absl::StatusOr<std::vector<TrainerTensor>> DTensorLayout(const ModelConfig& config,
                                                         const DTensorOptions& options) {
  if (absl::Status s = CheckLayoutSizes(config); !s.ok()) return s;
  if (absl::Status s = CheckDTensor(config, options); !s.ok()) return s;
  // The tensors: the HF ones, with each MoE layer's experts stacked when fused.
  std::vector<SourceTensor> tensors;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (SourceTensor& t : SourceTensors(config)) {
    shapes[t.name] = t.shape;
    const size_t at = t.name.find(".mlp.experts.");
    if (options.fused_experts && at != std::string::npos) {
      const std::string layer = t.name.substr(0, at + 4);  // "model.layers.N.mlp"
      if (t.name == layer + ".experts.0.gate_proj.weight") {
        tensors.push_back({layer + ".experts.gate_up_proj",
                           {config.experts, 2 * config.moe_intermediate, config.hidden},
                           t.dtype});
        tensors.push_back({layer + ".experts.down_proj",
                           {config.experts, config.hidden, config.moe_intermediate},
                           t.dtype});
      }
      continue;
    }
    tensors.push_back(std::move(t));
  }
  std::vector<TrainerTensor> out;
  for (const SourceTensor& t : tensors) {
    const std::vector<Placement>* placements = RuleFor(options, t.name);
    const std::vector<Placement> replicated(options.mesh.size());
    if (placements == nullptr) placements = &replicated;
    for (const Placement& p : *placements) {
      if (p.kind != Placement::Kind::kReplicate &&
          (p.dim < 0 || p.dim >= static_cast<int>(t.shape.size()))) {
        return Refuse(absl::StrCat("tensor '", t.name, "' ", planner::FormatShape(t.shape),
                                   ": placements ", FormatPlacements(*placements),
                                   " shard a dimension it does not have"));
      }
    }
    const std::vector<DimSlice> box = LocalBox(t.shape, *placements, options);
    TrainerTensor tensor;
    tensor.name = t.name;
    tensor.dtype = t.dtype;
    bool empty = false;
    for (const DimSlice& s : box) {
      tensor.shape.push_back(s.size);
      empty = empty || s.size == 0;
    }
    const size_t fused = t.name.find(".experts.gate_up_proj");
    const bool down = absl::EndsWith(t.name, ".experts.down_proj");
    if (empty) {
      // Nothing held: listed (a zero-size local shard), no parts.
    } else if (fused != std::string::npos || down) {
      const std::string layer = t.name.substr(0, t.name.find(".experts."));
      const int64_t im = config.moe_intermediate;
      for (int64_t e = box[0].start; e < box[0].start + box[0].size; ++e) {
        const std::string x = absl::StrCat(layer, ".experts.", e, ".");
        const int64_t at = e - box[0].start;
        if (down) {
          const std::string src = x + "down_proj.weight";
          tensor.parts.push_back({src, shapes[src], {box[1], box[2]}, {at, 0, 0}});
          continue;
        }
        // Rows [gate; up]: each half's share of the local rows.
        for (int half = 0; half < 2; ++half) {
          const int64_t lo = std::max(box[1].start, half * im);
          const int64_t hi = std::min(box[1].start + box[1].size, (half + 1) * im);
          if (hi <= lo) continue;
          const std::string src = x + (half == 0 ? "gate_proj.weight" : "up_proj.weight");
          tensor.parts.push_back(
              {src, shapes[src], {{lo - half * im, hi - lo}, box[2]}, {at, lo - box[1].start, 0}});
        }
      }
    } else {
      tensor.parts.push_back({t.name, t.shape, box, std::vector<int64_t>(t.shape.size(), 0)});
    }
    out.push_back(std::move(tensor));
  }
  return out;
}

absl::StatusOr<std::vector<Placement>> ParsePlacements(absl::string_view text) {
  std::vector<Placement> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    Placement p;
    absl::string_view arg;
    if (item == "R" || item == "Replicate()" || item == "Replicate") {
      out.push_back(p);
      continue;
    }
    if (absl::ConsumePrefix(&item, "SS(") || absl::ConsumePrefix(&item, "_StridedShard(")) {
      p.kind = Placement::Kind::kStridedShard;
    } else if (absl::ConsumePrefix(&item, "S(") || absl::ConsumePrefix(&item, "Shard(")) {
      p.kind = Placement::Kind::kShard;
    } else {
      return Refuse(absl::StrCat("placement '", item,
                                 "': expected R, S(d) or SS(d) (Replicate, Shard, _StridedShard)"));
    }
    arg = item;
    if (!absl::ConsumeSuffix(&arg, ")") || !absl::SimpleAtoi(arg, &p.dim) || p.dim < 0 ||
        p.dim > 3) {
      return Refuse(absl::StrCat("placement '", text, "': the shard dimension must be 0 to 3"));
    }
    out.push_back(p);
  }
  return out;
}

std::string FormatPlacements(const std::vector<Placement>& placements) {
  std::vector<std::string> items;
  for (const Placement& p : placements) {
    switch (p.kind) {
      case Placement::Kind::kReplicate:
        items.push_back("R");
        break;
      case Placement::Kind::kShard:
        items.push_back(absl::StrCat("S(", p.dim, ")"));
        break;
      case Placement::Kind::kStridedShard:
        items.push_back(absl::StrCat("SS(", p.dim, ")"));
        break;
    }
  }
  return absl::StrJoin(items, ",");
}

bool GlobMatch(absl::string_view pattern, absl::string_view name) {
  // Iterative '*' matching with backtracking to the last star.
  size_t p = 0, n = 0, star = absl::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p, ++n;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

DimSlice ChunkRows(int64_t n, int pieces, int index) {
  const int64_t per = std::max<int64_t>(CeilDiv(n, pieces), 1);
  const int64_t start = std::min<int64_t>(index * per, n);
  return {start, std::min(per, n - start)};
}

}  // namespace wb::engines
