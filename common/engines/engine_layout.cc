#include "common/engines/engine_layout.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/planner/name_rules.h"

namespace wb::engines {
namespace {

namespace v1 = weightbeam::v1;
using planner::kFp8Block;

// Both engines pad the global vocab to a multiple of 64 (DEFAULT_VOCAB_PADDING_SIZE).
constexpr int64_t kVocabPad = 64;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The linears both engines keep in FP8 under block quantisation; norms, embeddings, lm_head,
// the router and biases stay BF16 (as in the DeepSeek-V3 FP8 checkpoint).
constexpr const char* kFp8Suffixes[] = {
    ".qkv_proj.weight",           ".o_proj.weight",           ".gate_up_proj.weight",
    ".down_proj.weight",          ".fused_qkv_a_proj.weight", ".fused_qkv_a_proj_with_mqa.weight",
    ".q_b_proj.weight",           ".kv_b_proj.weight",        ".q_proj.weight",
    ".kv_a_proj_with_mqa.weight", ".experts.w13_weight",      ".experts.w2_weight",
};

bool IsFp8Param(const std::string& name) {
  for (const char* s : kFp8Suffixes) {
    if (absl::EndsWith(name, s)) return true;
  }
  return false;
}

// Which experts a rank holds and how each expert is TP-split.
struct MoeParallel {
  int64_t moe_tp = 1;
  int64_t moe_tp_rank = 0;
  std::vector<int64_t> experts;  // global ids, ascending; local index = position
};

// Builds one rank's parameters. The parallel settings are checked before (CheckParallel), so
// the builders only slice.
class Builder {
 public:
  Builder(const ModelConfig& c, const EngineOptions& o) : c_(c), o_(o) {
    for (const SourceTensor& s : SourceTensors(c)) source_shapes_[s.name] = s.shape;
  }

  std::vector<EngineParam> Build(const MoeParallel& moe) {
    Vocab("model.embed_tokens.weight", "model.embed_tokens.weight");
    for (int64_t i = 0; i < c_.layers; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      Replicated(p + "input_layernorm.weight");
      if (c_.family == Family::kDeepseek) {
        MlaAttention(p + "self_attn.");
      } else {
        Attention(p + "self_attn.");
      }
      Replicated(p + "post_attention_layernorm.weight");
      const std::string m = p + "mlp.";
      if (c_.IsMoeLayer(i)) {
        Replicated(m + "gate.weight");
        if (c_.router_bias) Replicated(m + "gate.e_score_correction_bias", v1::DTYPE_F32);
        Experts(m, moe);
        if (c_.family == Family::kDeepseek && c_.shared_experts > 0) {
          GateUp(m + "shared_experts.");
          RowParallel(m + "shared_experts.down_proj.weight", m + "shared_experts.down_proj.weight");
        }
      } else {
        GateUp(m);
        RowParallel(m + "down_proj.weight", m + "down_proj.weight");
      }
    }
    Replicated("model.norm.weight");
    if (!c_.tie_embeddings) Vocab("lm_head.weight", "lm_head.weight");
    return std::move(out_);
  }

 private:
  const std::vector<int64_t>& Shape(const std::string& source) { return source_shapes_[source]; }

  EngineParam& Param(const std::string& name, std::vector<int64_t> shape,
                     DType dtype = v1::DTYPE_BF16) {
    out_.push_back(EngineParam{name, dtype, std::move(shape), {}, ""});
    return out_.back();
  }

  void Part(EngineParam& param, const std::string& source, std::vector<DimSlice> box,
            std::vector<int64_t> offset) {
    param.parts.push_back(ParamPart{source, Shape(source), std::move(box), std::move(offset)});
  }

  // The whole HF tensor of the same name, on every rank.
  void Replicated(const std::string& name, DType dtype = v1::DTYPE_BF16) {
    const std::vector<int64_t>& shape = Shape(name);
    EngineParam& param = Param(name, shape, dtype);
    std::vector<DimSlice> box;
    for (int64_t d : shape) box.push_back({0, d});
    Part(param, name, box, std::vector<int64_t>(shape.size(), 0));
  }

  // VocabParallelEmbedding / ParallelLMHead: the padded vocab split evenly; rows past the
  // real vocab are padding (no part).
  void Vocab(const std::string& name, const std::string& source) {
    const int64_t per = CeilDiv(c_.vocab, kVocabPad) * kVocabPad / o_.tp;
    const int64_t start = std::min(o_.tp_rank * per, c_.vocab);
    const int64_t end = std::min((o_.tp_rank + 1) * per, c_.vocab);
    EngineParam& param = Param(name, {per, c_.hidden});
    if (end > start) Part(param, source, {{start, end - start}, {0, c_.hidden}}, {0, 0});
  }

  // ColumnParallel: rows [r*N/T, (r+1)*N/T).
  void ColumnParallel(const std::string& name, const std::string& source) {
    const std::vector<int64_t>& s = Shape(source);
    const int64_t rows = s[0] / o_.tp;
    EngineParam& param = Param(name, {rows, s[1]});
    Part(param, source, {{o_.tp_rank * rows, rows}, {0, s[1]}}, {0, 0});
  }

  // RowParallel: columns [r*K/T, (r+1)*K/T).
  void RowParallel(const std::string& name, const std::string& source) {
    const std::vector<int64_t>& s = Shape(source);
    const int64_t cols = s[1] / o_.tp;
    EngineParam& param = Param(name, {s[0], cols});
    Part(param, source, {{0, s[0]}, {o_.tp_rank * cols, cols}}, {0, 0});
  }

  // MergedColumnParallel [gate_r; up_r] of `prefix`gate_proj / up_proj.
  void GateUp(const std::string& prefix) {
    const std::vector<int64_t>& s = Shape(prefix + "gate_proj.weight");
    const int64_t rows = s[0] / o_.tp;
    EngineParam& param = Param(prefix + "gate_up_proj.weight", {2 * rows, s[1]});
    Part(param, prefix + "gate_proj.weight", {{o_.tp_rank * rows, rows}, {0, s[1]}}, {0, 0});
    Part(param, prefix + "up_proj.weight", {{o_.tp_rank * rows, rows}, {0, s[1]}}, {rows, 0});
  }

  // QKVParallel [q_r; k_r; v_r] with KV heads replicated when tp > num_key_value_heads.
  void Attention(const std::string& a) {
    const int64_t d = c_.head_dim, nq = c_.heads / o_.tp;
    int64_t k0 = 0, nk = 0;
    if (o_.tp >= c_.kv_heads) {
      nk = 1;
      k0 = o_.tp_rank / (o_.tp / c_.kv_heads);
    } else {
      nk = c_.kv_heads / o_.tp;
      k0 = o_.tp_rank * nk;
    }
    const int64_t rows = (nq + 2 * nk) * d;
    struct Slice {
      const char* proj;
      int64_t start, size, at;
    };
    const Slice slices[] = {{"q_proj", o_.tp_rank * nq * d, nq * d, 0},
                            {"k_proj", k0 * d, nk * d, nq * d},
                            {"v_proj", k0 * d, nk * d, (nq + nk) * d}};
    EngineParam& w = Param(a + "qkv_proj.weight", {rows, c_.hidden});
    for (const Slice& s : slices) {
      Part(w, a + s.proj + ".weight", {{s.start, s.size}, {0, c_.hidden}}, {s.at, 0});
    }
    if (c_.qkv_bias) {
      EngineParam& b = Param(a + "qkv_proj.bias", {rows});
      for (const Slice& s : slices) Part(b, a + s.proj + ".bias", {{s.start, s.size}}, {s.at});
    }
    if (c_.qk_norm) {
      Replicated(a + "q_norm.weight");
      Replicated(a + "k_norm.weight");
    }
    RowParallel(a + "o_proj.weight", a + "o_proj.weight");
  }

  // DeepSeek MLA: the replicated fused A projection, head-sharded q_b / kv_b, row-parallel o.
  void MlaAttention(const std::string& a) {
    if (c_.q_lora_rank > 0) {
      const std::string fused = o_.engine == Engine::kVllm ? "fused_qkv_a_proj.weight"
                                                           : "fused_qkv_a_proj_with_mqa.weight";
      const int64_t kv_rows = c_.kv_lora_rank + c_.qk_rope_head_dim;
      EngineParam& f = Param(a + fused, {c_.q_lora_rank + kv_rows, c_.hidden});
      Part(f, a + "q_a_proj.weight", {{0, c_.q_lora_rank}, {0, c_.hidden}}, {0, 0});
      Part(f, a + "kv_a_proj_with_mqa.weight", {{0, kv_rows}, {0, c_.hidden}}, {c_.q_lora_rank, 0});
      Replicated(a + "q_a_layernorm.weight");
      ColumnParallel(a + "q_b_proj.weight", a + "q_b_proj.weight");
    } else {
      ColumnParallel(a + "q_proj.weight", a + "q_proj.weight");
      Replicated(a + "kv_a_proj_with_mqa.weight");
    }
    Replicated(a + "kv_a_layernorm.weight");
    ColumnParallel(a + "kv_b_proj.weight", a + "kv_b_proj.weight");
    RowParallel(a + "o_proj.weight", a + "o_proj.weight");
  }

  // Fused MoE: w13 [E_loc, 2*Im_t, H] = per expert [gate; up], w2 [E_loc, H, Im_t].
  void Experts(const std::string& m, const MoeParallel& moe) {
    const int64_t el = static_cast<int64_t>(moe.experts.size());
    const int64_t im = c_.moe_intermediate / moe.moe_tp, h = c_.hidden;
    const int64_t start = moe.moe_tp_rank * im;
    EngineParam& w13 = Param(m + "experts.w13_weight", {el, 2 * im, h});
    for (int64_t j = 0; j < el; ++j) {
      const std::string e = absl::StrCat(m, "experts.", moe.experts[j], ".");
      Part(w13, e + "gate_proj.weight", {{start, im}, {0, h}}, {j, 0, 0});
      Part(w13, e + "up_proj.weight", {{start, im}, {0, h}}, {j, im, 0});
    }
    EngineParam& w2 = Param(m + "experts.w2_weight", {el, h, im});
    for (int64_t j = 0; j < el; ++j) {
      Part(w2, absl::StrCat(m, "experts.", moe.experts[j], ".down_proj.weight"),
           {{0, h}, {start, im}}, {j, 0, 0});
    }
  }

  const ModelConfig& c_;
  const EngineOptions& o_;
  std::map<std::string, std::vector<int64_t>> source_shapes_;
  std::vector<EngineParam> out_;
};

absl::Status Refuse(const std::string& what) { return absl::InvalidArgumentError(what); }

// The parallel settings against the model, before any slicing: one error naming the setting,
// the config field and the parameter that cannot be split.
absl::StatusOr<MoeParallel> CheckParallel(const ModelConfig& c, const EngineOptions& o) {
  if (o.tp < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp) {
    return Refuse(absl::StrCat("tp_rank ", o.tp_rank, " is not in [0, tp ", o.tp, ")"));
  }
  if (c.heads % o.tp != 0) {
    return Refuse(absl::StrCat("tp ", o.tp, " does not divide num_attention_heads ", c.heads,
                               " (model.layers.0.self_attn)"));
  }
  if (c.family != Family::kDeepseek) {
    const bool ok = o.tp >= c.kv_heads ? o.tp % c.kv_heads == 0 : c.kv_heads % o.tp == 0;
    if (!ok) {
      return Refuse(absl::StrCat("tp ", o.tp, " and num_key_value_heads ", c.kv_heads,
                                 ": one must divide the other "
                                 "(model.layers.0.self_attn.qkv_proj.weight)"));
    }
  }
  const int64_t padded = CeilDiv(c.vocab, kVocabPad) * kVocabPad;
  if (padded % o.tp != 0) {
    return Refuse(absl::StrCat("tp ", o.tp, " does not divide the padded vocab ", padded,
                               " (vocab_size ", c.vocab, "; model.embed_tokens.weight)"));
  }
  bool dense_layers = c.family == Family::kDense, moe_layers = false;
  for (int64_t i = 0; i < c.layers; ++i) (c.IsMoeLayer(i) ? moe_layers : dense_layers) = true;
  if (dense_layers && c.intermediate % o.tp != 0) {
    return Refuse(absl::StrCat("tp ", o.tp, " does not divide intermediate_size ", c.intermediate,
                               " (mlp.gate_up_proj.weight)"));
  }
  if (moe_layers && c.shared_experts > 0 && c.moe_intermediate * c.shared_experts % o.tp != 0) {
    return Refuse(absl::StrCat("tp ", o.tp, " does not divide the shared experts' intermediate ",
                               c.moe_intermediate * c.shared_experts,
                               " (mlp.shared_experts.gate_up_proj.weight)"));
  }
  MoeParallel moe;
  if (o.ep < 1) return Refuse(absl::StrCat("ep ", o.ep, " must be at least 1"));
  if (!moe_layers) {
    if (o.ep != 1) return Refuse(absl::StrCat("ep ", o.ep, ": the model has no experts"));
    return moe;
  }
  int64_t ep_rank = 0;
  if (o.ep == 1) {
    moe.moe_tp = o.tp;
    moe.moe_tp_rank = o.tp_rank;
  } else if (o.engine == Engine::kVllm) {
    // ep = dp * tp; experts are whole on each EP rank.
    if (o.ep % o.tp != 0) {
      return Refuse(absl::StrCat("vllm: ep ", o.ep, " must be a multiple of tp ", o.tp,
                                 " (ep = data_parallel_size * tp)"));
    }
    ep_rank = o.ep_rank < 0 ? o.tp_rank : o.ep_rank;
    if (ep_rank >= o.ep || ep_rank % o.tp != o.tp_rank) {
      return Refuse(absl::StrCat("vllm: ep_rank ", ep_rank, " of ep ", o.ep,
                                 " is not dp_rank * tp + tp_rank for tp_rank ", o.tp_rank));
    }
  } else {
    if (o.tp % o.ep != 0) {
      return Refuse(absl::StrCat("sglang: ep ", o.ep, " must divide tp ", o.tp));
    }
    moe.moe_tp = o.tp / o.ep;
    moe.moe_tp_rank = o.tp_rank % moe.moe_tp;
    ep_rank = o.tp_rank / moe.moe_tp;
    if (o.ep_rank >= 0 && o.ep_rank != ep_rank) {
      return Refuse(absl::StrCat("sglang: tp_rank ", o.tp_rank, " is ep_rank ", ep_rank, ", not ",
                                 o.ep_rank));
    }
    if (c.experts % o.ep != 0) {
      return Refuse(absl::StrCat("sglang: ep ", o.ep, " does not divide the ", c.experts,
                                 " experts (mlp.experts.w13_weight)"));
    }
  }
  if (c.moe_intermediate % moe.moe_tp != 0) {
    return Refuse(absl::StrCat("moe tp ", moe.moe_tp, " does not divide moe_intermediate_size ",
                               c.moe_intermediate, " (mlp.experts.w13_weight)"));
  }
  // vLLM 'linear' placement (the first E % ep ranks get one more); SGLang contiguous E / ep.
  const int64_t base = c.experts / o.ep, rem = c.experts % o.ep;
  const int64_t first = ep_rank * base + std::min(ep_rank, rem);
  const int64_t count = base + (ep_rank < rem ? 1 : 0);
  for (int64_t e = first; e < first + count; ++e) moe.experts.push_back(e);
  return moe;
}

// Why an FP8 part cuts a 128x128 block in dimension `dim` (of the parameter), or "" if not.
std::string BlockCut(const EngineParam& param, const ParamPart& part, size_t dim) {
  const size_t k = part.box.size(), n = param.shape.size();
  const size_t b = dim - (n - k);  // the box dimension mapped onto `dim`
  const DimSlice& s = part.box[b];
  const char* axis = dim + 1 == n ? "column" : "row";
  if (s.start % kFp8Block != 0) return absl::StrCat("source ", axis, " ", s.start);
  if (part.offset[dim] % kFp8Block != 0) {
    return absl::StrCat("destination ", axis, " ", part.offset[dim]);
  }
  const bool at_ends =
      s.start + s.size == part.source_shape[b] && part.offset[dim] + s.size == param.shape[dim];
  if (s.size % kFp8Block != 0 && !at_ends) {
    return absl::StrCat(axis, " extent ", s.size);
  }
  return "";
}

// Turns `param` FP8 and appends its "<name>_scale_inv": one f32 per 128x128 block (per expert
// for 3-D), filled by one scale part per weight part (the part's block range).
absl::StatusOr<EngineParam> MakeFp8(EngineParam& param, int tp) {
  const size_t n = param.shape.size();
  for (const ParamPart& part : param.parts) {
    for (size_t d = n - 2; d < n; ++d) {
      std::string cut = BlockCut(param, part, d);
      if (!cut.empty()) {
        return Refuse(absl::StrCat("engine parameter '", param.name, "': FP8 part '", part.source,
                                   "' ", planner::FormatSlice(part.box, part.source_shape),
                                   " at offset ", planner::FormatShape(part.offset),
                                   " cuts a 128x128 block (", cut, ") at tp ", tp,
                                   "; register BF16 destinations or pick a tp whose per-rank ",
                                   "partitions are multiples of 128"));
      }
    }
  }
  param.dtype = v1::DTYPE_F8_E4M3;
  EngineParam scale;
  scale.name = planner::ScaleTensorName(param.name);
  scale.dtype = v1::DTYPE_F32;
  scale.scale_of = param.name;
  scale.shape = param.shape;
  scale.shape[n - 2] = CeilDiv(param.shape[n - 2], kFp8Block);
  scale.shape[n - 1] = CeilDiv(param.shape[n - 1], kFp8Block);
  for (const ParamPart& part : param.parts) {
    ParamPart s;
    s.source = planner::ScaleTensorName(part.source);
    for (int64_t d : part.source_shape) s.source_shape.push_back(CeilDiv(d, kFp8Block));
    for (const DimSlice& b : part.box) {
      s.box.push_back({b.start / kFp8Block, CeilDiv(b.size, kFp8Block)});
    }
    s.offset = part.offset;
    for (size_t d = n - 2; d < n; ++d) s.offset[d] /= kFp8Block;
    scale.parts.push_back(std::move(s));
  }
  return scale;
}

}  // namespace

const char* EngineName(Engine engine) { return engine == Engine::kVllm ? "vllm" : "sglang"; }

absl::StatusOr<Engine> ParseEngine(absl::string_view name) {
  if (name == "vllm") return Engine::kVllm;
  if (name == "sglang") return Engine::kSglang;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown engine '", name, "'; expected vllm or sglang"));
}

absl::StatusOr<std::vector<EngineParam>> EngineLayout(const ModelConfig& config,
                                                      const EngineOptions& options) {
  absl::StatusOr<MoeParallel> moe = CheckParallel(config, options);
  if (!moe.ok()) return moe.status();
  std::vector<EngineParam> params = Builder(config, options).Build(*moe);
  if (!options.fp8) return params;
  std::vector<EngineParam> out;
  for (EngineParam& p : params) {
    if (!IsFp8Param(p.name)) {
      out.push_back(std::move(p));
      continue;
    }
    absl::StatusOr<EngineParam> scale = MakeFp8(p, options.tp);
    if (!scale.ok()) return scale.status();
    out.push_back(std::move(p));
    out.push_back(*std::move(scale));
  }
  return out;
}

std::vector<SourceTensor> SourceTensors(const ModelConfig& c) {
  std::vector<SourceTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, DType dtype = v1::DTYPE_BF16) {
    out.push_back({std::move(name), std::move(shape), dtype});
  };
  const int64_t h = c.hidden;
  add("model.embed_tokens.weight", {c.vocab, h});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const std::string a = p + "self_attn.";
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
    if (c.family == Family::kDeepseek) {
      const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
      if (c.q_lora_rank > 0) {
        add(a + "q_a_proj.weight", {c.q_lora_rank, h});
        add(a + "q_a_layernorm.weight", {c.q_lora_rank});
        add(a + "q_b_proj.weight", {c.heads * qk, c.q_lora_rank});
      } else {
        add(a + "q_proj.weight", {c.heads * qk, h});
      }
      add(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h});
      add(a + "kv_a_layernorm.weight", {c.kv_lora_rank});
      add(a + "kv_b_proj.weight", {c.heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
      add(a + "o_proj.weight", {h, c.heads * c.v_head_dim});
    } else {
      const int64_t d = c.head_dim;
      add(a + "q_proj.weight", {c.heads * d, h});
      add(a + "k_proj.weight", {c.kv_heads * d, h});
      add(a + "v_proj.weight", {c.kv_heads * d, h});
      add(a + "o_proj.weight", {h, c.heads * d});
      if (c.qkv_bias) {
        add(a + "q_proj.bias", {c.heads * d});
        add(a + "k_proj.bias", {c.kv_heads * d});
        add(a + "v_proj.bias", {c.kv_heads * d});
      }
      if (c.qk_norm) {
        add(a + "q_norm.weight", {d});
        add(a + "k_norm.weight", {d});
      }
    }
    const std::string m = p + "mlp.";
    if (c.IsMoeLayer(i)) {
      add(m + "gate.weight", {c.experts, h});
      if (c.router_bias) add(m + "gate.e_score_correction_bias", {c.experts}, v1::DTYPE_F32);
      for (int64_t e = 0; e < c.experts; ++e) {
        const std::string x = absl::StrCat(m, "experts.", e, ".");
        add(x + "gate_proj.weight", {c.moe_intermediate, h});
        add(x + "up_proj.weight", {c.moe_intermediate, h});
        add(x + "down_proj.weight", {h, c.moe_intermediate});
      }
      if (c.family == Family::kDeepseek && c.shared_experts > 0) {
        const int64_t is = c.moe_intermediate * c.shared_experts;
        add(m + "shared_experts.gate_proj.weight", {is, h});
        add(m + "shared_experts.up_proj.weight", {is, h});
        add(m + "shared_experts.down_proj.weight", {h, is});
      }
    } else {
      add(m + "gate_proj.weight", {c.intermediate, h});
      add(m + "up_proj.weight", {c.intermediate, h});
      add(m + "down_proj.weight", {h, c.intermediate});
    }
  }
  add("model.norm.weight", {h});
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab, h});
  return out;
}

namespace {

int64_t FsdpChunkRows(int64_t rows, int world, int64_t align, bool whole_small) {
  // A tensor of fewer align-row blocks than ranks, cut block by block, gives every destination
  // shard one op per block (one 128x128 FP8 tile for a row-parallel TP shard 128 columns wide):
  // held whole, it is one op per destination.
  if (whole_small && align > 1 && CeilDiv(rows, align) < world) return std::max<int64_t>(rows, 1);
  int64_t per = CeilDiv(rows, world);
  if (align > 1) per = CeilDiv(per, align) * align;
  return std::max<int64_t>(per, 1);
}

}  // namespace

DimSlice FsdpRows(int64_t rows, int world, int rank, int64_t align, int first_rank,
                  bool whole_small) {
  const int64_t per = FsdpChunkRows(rows, world, align, whole_small);
  const int64_t chunk = ((static_cast<int64_t>(rank) - first_rank) % world + world) % world;
  const int64_t start = std::min<int64_t>(chunk * per, rows);
  return {start, std::min(per, rows - start)};
}

std::vector<int> FsdpFirstRanks(const std::vector<SourceTensor>& tensors, int world, int64_t align,
                                bool whole_small) {
  std::vector<int> first(tensors.size(), 0);
  if (align <= 1 || world < 1) return first;
  int64_t next = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    first[i] = static_cast<int>(next);
    const int64_t rows = tensors[i].shape.empty() ? 1 : tensors[i].shape[0];
    const int64_t chunks = CeilDiv(rows, FsdpChunkRows(rows, world, align, whole_small));
    next = (next + chunks) % world;
  }
  return first;
}

}  // namespace wb::engines
