#include "tests/demo/expected_layout.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace wb::demo {

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// vLLM's DEFAULT_VOCAB_PADDING_SIZE: VocabParallelEmbedding / ParallelLMHead pad the vocab to a
// multiple of 64 and give each rank an equal share of the padded rows.
constexpr int64_t kVocabPadding = 64;

}  // namespace

std::string Qwen3ConfigJson(const Qwen3Shape& s) {
  return absl::StrCat(R"({
  "architectures": ["Qwen3ForCausalLM"],
  "model_type": "qwen3",
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": )",
                      s.head_dim, R"(,
  "hidden_act": "silu",
  "hidden_size": )",
                      s.hidden, R"(,
  "initializer_range": 0.02,
  "intermediate_size": )",
                      s.intermediate, R"(,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "num_attention_heads": )",
                      s.heads, R"(,
  "num_hidden_layers": )",
                      s.layers, R"(,
  "num_key_value_heads": )",
                      s.kv_heads, R"(,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": )",
                      s.tie_embeddings ? "true" : "false", R"(,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": )",
                      s.vocab,
                      s.fp8 ? R"(,
  "quantization_config": {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128]
  }
}
)"
                            : "\n}\n");
}

std::vector<HfTensor> Qwen3HfTensors(const Qwen3Shape& s) {
  const int64_t h = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  std::vector<HfTensor> out{{"model.embed_tokens.weight", {s.vocab, h}}};
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    out.push_back({p + "self_attn.q_norm.weight", {s.head_dim}});
    out.push_back({p + "self_attn.k_norm.weight", {s.head_dim}});
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    out.push_back({p + "mlp.gate_proj.weight", {s.intermediate, h}});
    out.push_back({p + "mlp.up_proj.weight", {s.intermediate, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, s.intermediate}});
  }
  out.push_back({"model.norm.weight", {h}});
  if (!s.tie_embeddings) out.push_back({"lm_head.weight", {s.vocab, h}});
  return out;
}

Rows TorchChunk(int64_t rows, int world, int rank) {
  const int64_t per = CeilDiv(rows, world);
  const int64_t start = per * rank;
  if (start >= rows) return {rows, 0};
  return {start, std::min(per, rows - start)};
}

std::string Fp8BlockCut(const Qwen3Shape& s, int trainers) {
  const Qwen3Shape one = [&] {
    Qwen3Shape o = s;
    o.layers = 1;  // every layer has the same shapes
    return o;
  }();
  for (const HfTensor& t : Qwen3HfTensors(one)) {
    if (t.shape.size() != 2 || t.name.find("_proj.weight") == std::string::npos) continue;
    for (int r = 1; r < trainers; ++r) {
      const Rows rows = TorchChunk(t.shape[0], trainers, r);
      if (rows.size > 0 && rows.start % 128 != 0) {
        return absl::StrCat(t.name, " at row ", rows.start);
      }
    }
  }
  return "";
}

Matrix2d As2d(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return {1, shape[0]};
  return {shape[0], shape[1]};
}

std::vector<ExpectedParam> VllmQwen3Rank(const Qwen3Shape& s, int tp, int rank, bool fp8) {
  const int64_t h = s.hidden, d = s.head_dim;
  if (tp < 1 || rank < 0 || rank >= tp || s.heads % tp != 0 || s.intermediate % tp != 0 ||
      (tp >= s.kv_heads ? tp % s.kv_heads != 0 : s.kv_heads % tp != 0) ||
      CeilDiv(s.vocab, kVocabPadding) * kVocabPadding % tp != 0) {
    return {};
  }
  std::vector<ExpectedParam> out;
  // A 1-D tensor whole, on every rank.
  auto whole = [&](const std::string& name, int64_t n) {
    out.push_back({name, {n}, false, {{name, 0, 0, 1, 0}}});
  };
  // The rank's share of the padded vocab; its rows past the real vocab are padding.
  auto vocab = [&](const std::string& name) {
    const int64_t per = CeilDiv(s.vocab, kVocabPadding) * kVocabPadding / tp;
    const int64_t first = rank * per, real = std::max<int64_t>(0, std::min(per, s.vocab - first));
    ExpectedParam p{name, {per, h}, false, {}};
    if (real > 0) p.copies.push_back({name, first, 0, real, 0});
    out.push_back(p);
  };

  vocab("model.embed_tokens.weight");
  const int64_t nq = s.heads / tp;
  // KV heads: tp <= kv heads splits them; a larger tp replicates each over tp / kv_heads ranks.
  const int64_t nk = tp >= s.kv_heads ? 1 : s.kv_heads / tp;
  const int64_t k0 = tp >= s.kv_heads ? rank / (tp / s.kv_heads) : rank * nk;
  const int64_t im = s.intermediate / tp, oc = s.heads * d / tp;
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const std::string a = p + "self_attn.", m = p + "mlp.";
    whole(p + "input_layernorm.weight", h);
    out.push_back({a + "qkv_proj.weight",
                   {(nq + 2 * nk) * d, h},
                   fp8,
                   {{a + "q_proj.weight", rank * nq * d, 0, nq * d, 0},
                    {a + "k_proj.weight", k0 * d, 0, nk * d, nq * d},
                    {a + "v_proj.weight", k0 * d, 0, nk * d, (nq + nk) * d}}});
    whole(a + "q_norm.weight", d);
    whole(a + "k_norm.weight", d);
    // Row-parallel: every row, the rank's columns.
    out.push_back({a + "o_proj.weight", {h, oc}, fp8, {{a + "o_proj.weight", 0, rank * oc, h, 0}}});
    whole(p + "post_attention_layernorm.weight", h);
    out.push_back({m + "gate_up_proj.weight",
                   {2 * im, h},
                   fp8,
                   {{m + "gate_proj.weight", rank * im, 0, im, 0},
                    {m + "up_proj.weight", rank * im, 0, im, im}}});
    out.push_back(
        {m + "down_proj.weight", {h, im}, fp8, {{m + "down_proj.weight", 0, rank * im, h, 0}}});
  }
  whole("model.norm.weight", h);
  // Tied: vLLM's lm_head is embed_tokens itself and no parameter of its own.
  if (!s.tie_embeddings) vocab("lm_head.weight");
  return out;
}

std::vector<uint16_t> Assemble(
    const ExpectedParam& p,
    const std::function<const std::vector<uint16_t>&(const std::string& name)>& source,
    const std::function<Matrix2d(const std::string& name)>& source_shape) {
  const Matrix2d dst = As2d(p.shape);
  std::vector<uint16_t> out(static_cast<size_t>(dst.rows * dst.cols), 0);
  for (const RowCopy& c : p.copies) {
    const std::vector<uint16_t>& src = source(c.source);
    const int64_t src_cols = source_shape(c.source).cols;
    for (int64_t r = 0; r < c.rows; ++r) {
      std::memcpy(&out[static_cast<size_t>((c.dst_row + r) * dst.cols)],
                  &src[static_cast<size_t>((c.src_row + r) * src_cols + c.src_col)],
                  static_cast<size_t>(dst.cols) * 2);
    }
  }
  return out;
}

}  // namespace wb::demo
