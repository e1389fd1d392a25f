// Engine layouts from config.json: shapes, part boxes and offsets per rank for vLLM and SGLang,
// FP8 scale parts, and the refusals (unknown architecture, tp not dividing heads, FP8 parts
// that cut a 128x128 block).
#include "common/engines/engine_layout.h"

#include <algorithm>
#include <map>
#include <string>

#include "catch2/catch.hpp"

namespace {

using wb::engines::Engine;
using wb::engines::EngineLayout;
using wb::engines::EngineOptions;
using wb::engines::EngineParam;
using wb::engines::LoadModelConfig;
using wb::engines::ModelConfig;
using wb::engines::ParseModelConfig;
using Shape = std::vector<int64_t>;

ModelConfig Load(const std::string& family) {
  auto c = LoadModelConfig("tests/python/engine_configs/" + family + ".json");
  REQUIRE(c.ok());
  return *c;
}

std::map<std::string, EngineParam> Layout(const ModelConfig& c, EngineOptions o) {
  auto params = EngineLayout(c, o);
  INFO(params.status().ToString());
  REQUIRE(params.ok());
  std::map<std::string, EngineParam> out;
  for (auto& p : *params) out[p.name] = p;
  return out;
}

std::string Error(const ModelConfig& c, EngineOptions o) {
  auto params = EngineLayout(c, o);
  REQUIRE_FALSE(params.ok());
  return std::string(params.status().message());
}

// (start, size) pairs of a part's box, flattened.
Shape Box(const wb::engines::ParamPart& p) {
  Shape out;
  for (auto s : p.box) {
    out.push_back(s.start);
    out.push_back(s.size);
  }
  return out;
}

int64_t Volume(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

TEST_CASE("config.json fields of every family parse") {
  ModelConfig llama = Load("llama");
  CHECK(llama.family == wb::engines::Family::kDense);
  CHECK(llama.head_dim == 64);
  CHECK_FALSE(llama.qkv_bias);
  ModelConfig qwen2 = Load("qwen2");
  CHECK(qwen2.head_dim == 32);  // hidden / heads
  CHECK(qwen2.qkv_bias);
  CHECK(qwen2.tie_embeddings);
  CHECK(Load("qwen3").qk_norm);
  ModelConfig moe = Load("qwen3_moe");
  CHECK(moe.family == wb::engines::Family::kMoe);
  CHECK(moe.IsMoeLayer(0));
  ModelConfig ds = Load("deepseek_v3");
  CHECK(ds.family == wb::engines::Family::kDeepseek);
  CHECK_FALSE(ds.IsMoeLayer(0));
  CHECK(ds.IsMoeLayer(1));
  CHECK(ds.router_bias);
  CHECK(ds.weight_block_size == Shape{128, 128});
}

TEST_CASE("an unknown architecture or a missing field is one error naming it") {
  auto c = ParseModelConfig(R"({"architectures": ["GPT2LMHeadModel"], "hidden_size": 8})",
                            "gpt2/config.json");
  REQUIRE_FALSE(c.ok());
  CHECK(std::string(c.status().message())
            .find("gpt2/config.json: unknown architecture 'GPT2LMHeadModel'") == 0);
  c = ParseModelConfig(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10})",
                       "x.json");
  REQUIRE_FALSE(c.ok());
  CHECK(std::string(c.status().message()) ==
        "x.json: missing 'intermediate_size' (a positive integer)");
  CHECK_FALSE(ParseModelConfig("[1]", "y.json").ok());
}

TEST_CASE("qkv_proj holds [q_r; k_r; v_r], replicating KV heads when tp > num_kv_heads") {
  ModelConfig c = Load("llama");  // nh 8, nkv 2, D 64, H 256
  auto p = Layout(c, {Engine::kVllm, 4, 3});
  const EngineParam& qkv = p.at("model.layers.0.self_attn.qkv_proj.weight");
  CHECK(qkv.shape == Shape{4 * 64, 256});
  REQUIRE(qkv.parts.size() == 3);
  CHECK(qkv.parts[0].source == "model.layers.0.self_attn.q_proj.weight");
  CHECK(Box(qkv.parts[0]) == Shape{3 * 128, 128, 0, 256});
  CHECK(qkv.parts[0].offset == Shape{0, 0});
  CHECK(qkv.parts[1].source == "model.layers.0.self_attn.k_proj.weight");
  CHECK(Box(qkv.parts[1]) == Shape{64, 64, 0, 256});  // rank 3 of 4 holds kv head 1
  CHECK(qkv.parts[1].offset == Shape{128, 0});
  CHECK(Box(qkv.parts[2]) == Shape{64, 64, 0, 256});
  CHECK(qkv.parts[2].offset == Shape{192, 0});
  // tp < nkv: no replication.
  ModelConfig q3 = Load("qwen3");  // nkv 4
  auto r1 = Layout(q3, {Engine::kSglang, 2, 1});
  const EngineParam& q3qkv = r1.at("model.layers.2.self_attn.qkv_proj.weight");
  CHECK(q3qkv.shape == Shape{(4 + 2 + 2) * 128, 256});
  CHECK(Box(q3qkv.parts[1]) == Shape{256, 256, 0, 256});
  CHECK(r1.at("model.layers.0.self_attn.q_norm.weight").shape == Shape{128});
  CHECK(r1.count("lm_head.weight") == 0);  // tied
}

TEST_CASE("row-parallel, gate_up and qkv bias slices") {
  ModelConfig c = Load("qwen2");  // I 512, nkv 1, bias
  auto p = Layout(c, {Engine::kVllm, 2, 1});
  const EngineParam& o = p.at("model.layers.1.self_attn.o_proj.weight");
  CHECK(o.shape == Shape{256, 128});
  CHECK(Box(o.parts[0]) == Shape{0, 256, 128, 128});
  const EngineParam& gu = p.at("model.layers.0.mlp.gate_up_proj.weight");
  CHECK(gu.shape == Shape{512, 256});
  CHECK(gu.parts[1].source == "model.layers.0.mlp.up_proj.weight");
  CHECK(Box(gu.parts[1]) == Shape{256, 256, 0, 256});
  CHECK(gu.parts[1].offset == Shape{256, 0});
  const EngineParam& bias = p.at("model.layers.0.self_attn.qkv_proj.bias");
  CHECK(bias.shape == Shape{(4 + 2) * 32});
  CHECK(Box(bias.parts[2]) == Shape{0, 32});
  CHECK(bias.parts[2].offset == Shape{5 * 32});
}

TEST_CASE("vocab is padded to 64 then split; padding rows have no part") {
  ModelConfig c = Load("qwen2");  // V 130 -> 192, tp 8: 24 rows per rank
  auto r5 = Layout(c, {Engine::kSglang, 8, 5});
  const EngineParam& e5 = r5.at("model.embed_tokens.weight");
  CHECK(e5.shape == Shape{24, 256});
  REQUIRE(e5.parts.size() == 1);
  CHECK(Box(e5.parts[0]) == Shape{120, 10, 0, 256});
  auto r6 = Layout(c, {Engine::kSglang, 8, 6});
  CHECK(r6.at("model.embed_tokens.weight").parts.empty());
  CHECK(Layout(Load("llama"), {Engine::kVllm, 1, 0}).at("lm_head.weight").shape ==
        Shape{1024, 256});
}

TEST_CASE("fused MoE experts: placement and TP split per engine") {
  ModelConfig c = Load("qwen3_moe");  // E 8, Im 1024, H 256
  // vLLM EP (ep = dp * tp = 2 with tp 1): dp rank 1 holds experts 4..7 whole.
  auto v = Layout(c, {Engine::kVllm, 1, 0, 2, 1});
  const EngineParam& w13 = v.at("model.layers.1.mlp.experts.w13_weight");
  CHECK(w13.shape == Shape{4, 2048, 256});
  CHECK(w13.parts[0].source == "model.layers.1.mlp.experts.4.gate_proj.weight");
  CHECK(w13.parts[7].source == "model.layers.1.mlp.experts.7.up_proj.weight");
  CHECK(w13.parts[7].offset == Shape{3, 1024, 0});
  // SGLang tp 4 ep 2: moe_tp 2; rank 3 is ep rank 1, moe tp rank 1.
  auto s = Layout(c, {Engine::kSglang, 4, 3, 2});
  const EngineParam& s13 = s.at("model.layers.0.mlp.experts.w13_weight");
  CHECK(s13.shape == Shape{4, 1024, 256});
  CHECK(s13.parts[0].source == "model.layers.0.mlp.experts.4.gate_proj.weight");
  CHECK(Box(s13.parts[0]) == Shape{512, 512, 0, 256});
  CHECK(s13.parts[1].offset == Shape{0, 512, 0});
  const EngineParam& s2 = s.at("model.layers.0.mlp.experts.w2_weight");
  CHECK(s2.shape == Shape{4, 256, 512});
  CHECK(Box(s2.parts[3]) == Shape{0, 256, 512, 512});
  CHECK(s2.parts[3].offset == Shape{3, 0, 0});
  CHECK(Error(c, {Engine::kSglang, 2, 0, 4}) == "sglang: ep 4 must divide tp 2");
  CHECK(Error(c, {Engine::kVllm, 2, 1, 4, 2}).find("vllm: ep_rank 2 of ep 4") == 0);
}

TEST_CASE("DeepSeek MLA: fused A projection named per engine, head-sharded q_b / kv_b") {
  ModelConfig c = Load("deepseek_v3");  // nh 16, ql 256, kvl 256, rope 64
  auto v = Layout(c, {Engine::kVllm, 2, 1});
  const EngineParam& a = v.at("model.layers.0.self_attn.fused_qkv_a_proj.weight");
  CHECK(a.shape == Shape{256 + 256 + 64, 256});
  CHECK(a.parts[1].source == "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  CHECK(a.parts[1].offset == Shape{256, 0});
  CHECK(v.at("model.layers.0.self_attn.q_b_proj.weight").shape == Shape{8 * 192, 256});
  CHECK(Box(v.at("model.layers.0.self_attn.kv_b_proj.weight").parts[0]) ==
        Shape{8 * 256, 8 * 256, 0, 256});
  CHECK(v.at("model.layers.1.mlp.gate.e_score_correction_bias").dtype == weightbeam::v1::DTYPE_F32);
  CHECK(v.at("model.layers.1.mlp.shared_experts.gate_up_proj.weight").shape == Shape{1024, 256});
  CHECK(v.count("model.layers.0.mlp.gate_up_proj.weight") == 1);  // first_k_dense_replace
  auto s = Layout(c, {Engine::kSglang, 1, 0});
  CHECK(s.count("model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight") == 1);
}

TEST_CASE("every element is covered exactly once except vocab padding") {
  for (const char* family : {"llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3"}) {
    ModelConfig c = Load(family);
    for (Engine e : {Engine::kVllm, Engine::kSglang}) {
      for (int tp : {1, 2, 4, 8}) {
        for (int r = 0; r < tp; ++r) {
          for (auto& [name, p] : Layout(c, {e, tp, r})) {
            int64_t covered = 0;
            for (auto& part : p.parts) {
              Shape size;
              for (auto s : part.box) size.push_back(s.size);
              covered += Volume(size);
            }
            INFO(family << " tp " << tp << " rank " << r << " " << name);
            if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
              CHECK(covered <= Volume(p.shape));
            } else {
              CHECK(covered == Volume(p.shape));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("FP8: scale parameters and parts; block-cutting parts are refused by name") {
  ModelConfig q3 = Load("qwen3");  // D 128, I 1024: aligned up to tp 8
  auto p = Layout(q3, {Engine::kVllm, 8, 7, 1, -1, true});
  const EngineParam& qkv = p.at("model.layers.0.self_attn.qkv_proj.weight");
  CHECK(qkv.dtype == weightbeam::v1::DTYPE_F8_E4M3);
  const EngineParam& scale = p.at("model.layers.0.self_attn.qkv_proj.weight_scale_inv");
  CHECK(scale.dtype == weightbeam::v1::DTYPE_F32);
  CHECK(scale.shape == Shape{3, 2});
  CHECK(scale.parts[1].source == "model.layers.0.self_attn.k_proj.weight_scale_inv");
  CHECK(scale.parts[1].source_shape == Shape{4, 2});
  CHECK(Box(scale.parts[1]) == Shape{3, 1, 0, 2});  // rank 7 of 8 holds kv head 3
  CHECK(scale.parts[1].offset == Shape{1, 0});
  CHECK(p.at("model.embed_tokens.weight").dtype == weightbeam::v1::DTYPE_BF16);
  CHECK(p.at("model.layers.0.input_layernorm.weight").dtype == weightbeam::v1::DTYPE_BF16);

  auto moe = Layout(Load("qwen3_moe"), {Engine::kSglang, 8, 2, 2, -1, true});
  CHECK(moe.at("model.layers.0.mlp.experts.w13_weight_scale_inv").shape == Shape{4, 4, 2});
  CHECK(moe.at("model.layers.0.mlp.gate.weight").dtype == weightbeam::v1::DTYPE_BF16);

  // The fused A projection ends in a ragged 64-row block (576 rows): allowed at the end.
  auto ds = Layout(Load("deepseek_v3"), {Engine::kSglang, 8, 0, 1, -1, true});
  CHECK(ds.at("model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight_scale_inv").shape ==
        Shape{5, 2});

  // llama at tp 2: k_proj is 64 rows at row 128 of qkv_proj, then v_proj at row 192.
  CHECK(Error(Load("llama"), {Engine::kVllm, 2, 0, 1, -1, true}) ==
        "engine parameter 'model.layers.0.self_attn.qkv_proj.weight': FP8 part "
        "'model.layers.0.self_attn.k_proj.weight' [0:64, 0:256] at offset [256, 0] cuts a "
        "128x128 block (row extent 64) at tp 2; register BF16 destinations or pick a tp whose "
        "per-rank partitions are multiples of 128");
  CHECK(Error(Load("qwen2"), {Engine::kSglang, 1, 0, 1, -1, true})
            .find("engine parameter 'model.layers.0.self_attn.qkv_proj.weight'") == 0);
  CHECK(Layout(Load("llama"), {Engine::kVllm, 1, 0, 1, -1, true}).size() > 0);
}

TEST_CASE("tp that does not divide the heads is one clear error") {
  CHECK(Error(Load("llama"), {Engine::kVllm, 3, 0}) ==
        "tp 3 does not divide num_attention_heads 8 (model.layers.0.self_attn)");
  CHECK(Error(Load("qwen3"), {Engine::kVllm, 16, 0}) ==
        "tp 16 does not divide num_attention_heads 8 (model.layers.0.self_attn)");
  CHECK(Error(Load("llama"), {Engine::kVllm, 2, 2}) == "tp_rank 2 is not in [0, tp 2)");
  CHECK(Error(Load("llama"), {Engine::kVllm, 1, 0, 2}) == "ep 2: the model has no experts");
}

TEST_CASE("Mistral: the engines load it as Llama, so its layout is Llama's") {
  const std::string body = R"(, "model_type": "x", "hidden_size": 512, "intermediate_size": 1024,
      "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
      "head_dim": null, "vocab_size": 1000, "sliding_window": null})";
  auto mistral = ParseModelConfig(R"({"architectures": ["MistralForCausalLM"])" + body, "m");
  auto llama = ParseModelConfig(R"({"architectures": ["LlamaForCausalLM"])" + body, "l");
  REQUIRE(mistral.ok());
  REQUIRE(llama.ok());
  CHECK(mistral->family == wb::engines::Family::kDense);
  CHECK(mistral->head_dim == 64);
  for (Engine engine : {Engine::kVllm, Engine::kSglang}) {
    auto m = Layout(*mistral, {engine, 2, 1, 1, -1, false});
    auto l = Layout(*llama, {engine, 2, 1, 1, -1, false});
    REQUIRE(m.size() == l.size());
    CHECK(m.count("model.layers.1.self_attn.qkv_proj.weight") == 1);
    for (const auto& [name, p] : l) {
      INFO(name);
      REQUIRE(m.count(name) == 1);
      CHECK(m.at(name).shape == p.shape);
      REQUIRE(m.at(name).parts.size() == p.parts.size());
      for (size_t i = 0; i < p.parts.size(); ++i) {
        CHECK(m.at(name).parts[i].source == p.parts[i].source);
        CHECK(m.at(name).parts[i].offset == p.parts[i].offset);
      }
    }
  }
}

TEST_CASE("source tensors and FSDP rows") {
  auto src = wb::engines::SourceTensors(Load("deepseek_v3"));
  std::map<std::string, Shape> shapes;
  for (auto& s : src) shapes[s.name] = s.shape;
  CHECK(shapes.at("model.layers.0.self_attn.q_b_proj.weight") == Shape{16 * 192, 256});
  CHECK(shapes.at("model.layers.1.mlp.experts.7.down_proj.weight") == Shape{256, 1024});
  CHECK(shapes.count("model.layers.0.mlp.experts.0.gate_proj.weight") == 0);
  auto rows = wb::engines::FsdpRows(300, 2, 1, 128);
  CHECK(rows.start == 256);
  CHECK(rows.size == 44);
  rows = wb::engines::FsdpRows(128, 2, 1, 128);
  CHECK(rows.size == 0);
  rows = wb::engines::FsdpRows(10, 3, 2, 1);
  CHECK(rows.start == 8);
  CHECK(rows.size == 2);
  // Chunk c on rank (first + c) % world: 300 rows in chunks of 128 from rank 3 of 4.
  CHECK(wb::engines::FsdpRows(300, 4, 3, 128, 3).start == 0);
  CHECK(wb::engines::FsdpRows(300, 4, 0, 128, 3).start == 128);
  CHECK(wb::engines::FsdpRows(300, 4, 1, 128, 3).size == 44);
  CHECK(wb::engines::FsdpRows(300, 4, 2, 128, 3).size == 0);
}

TEST_CASE("aligned FSDP shards: each tensor starts after the previous one's last chunk") {
  using wb::engines::SourceTensor;
  // 128 rows (1 chunk), 384 (3 chunks of 128), 1024 over 4 ranks (4 chunks of 256), 200 (2).
  std::vector<SourceTensor> t = {{"a", {128, 8}}, {"b", {384, 8}}, {"c", {1024, 8}}, {"d", {200}}};
  CHECK(wb::engines::FsdpFirstRanks(t, 4, 128) == std::vector<int>{0, 1, 0, 0});
  // torch.chunk (align 1) is what FSDP2 holds: never rotated.
  CHECK(wb::engines::FsdpFirstRanks(t, 4, 1) == std::vector<int>{0, 0, 0, 0});
  CHECK(wb::engines::FsdpFirstRanks(t, 4, 0) == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("aligned FSDP shards, small tensors whole (FP8 destinations)") {
  using wb::engines::FsdpRows;
  using wb::engines::SourceTensor;
  // 300 rows = 3 blocks, fewer than 4 ranks: all on the first rank; 600 rows = 5 blocks, not
  // fewer: chunks of 256 as without whole_small.
  CHECK(FsdpRows(300, 4, 2, 128, 2, true).start == 0);
  CHECK(FsdpRows(300, 4, 2, 128, 2, true).size == 300);
  for (int r : {0, 1, 3}) CHECK(FsdpRows(300, 4, r, 128, 2, true).size == 0);
  for (int r = 0; r < 4; ++r) {
    CHECK(FsdpRows(600, 4, r, 128, 0, true).start == FsdpRows(600, 4, r, 128, 0).start);
    CHECK(FsdpRows(600, 4, r, 128, 0, true).size == FsdpRows(600, 4, r, 128, 0).size);
  }
  // torch.chunk (align 1) is never held whole.
  CHECK(FsdpRows(3, 4, 0, 1, 0, true).size == 1);
  // A whole tensor takes one rank: 128 (1), 384 (whole: 3 blocks < 4), 1024 (4 chunks), 200.
  std::vector<SourceTensor> t = {{"a", {128, 8}}, {"b", {384, 8}}, {"c", {1024, 8}}, {"d", {200}}};
  CHECK(wb::engines::FsdpFirstRanks(t, 4, 128, true) == std::vector<int>{0, 1, 2, 2});
}

// Per-rank elements of `src` under aligned FSDP shards (first ranks from FsdpFirstRanks, or 0
// for every tensor), after checking that each tensor's pieces tile its rows exactly and that
// every piece but the last is whole 128-row blocks.
std::vector<int64_t> AlignedShardElems(const std::vector<wb::engines::SourceTensor>& src, int world,
                                       bool rotated) {
  const auto first = wb::engines::FsdpFirstRanks(src, world, 128);
  REQUIRE(first.size() == src.size());
  std::vector<int64_t> elems(world, 0);
  for (size_t i = 0; i < src.size(); ++i) {
    const int64_t rows = src[i].shape[0];
    int64_t row_elems = 1;
    for (size_t d = 1; d < src[i].shape.size(); ++d) row_elems *= src[i].shape[d];
    std::vector<std::pair<int64_t, int64_t>> pieces;
    for (int r = 0; r < world; ++r) {
      auto s = wb::engines::FsdpRows(rows, world, r, 128, rotated ? first[i] : 0);
      if (s.size > 0) pieces.emplace_back(s.start, s.size);
      elems[r] += s.size * row_elems;
    }
    std::sort(pieces.begin(), pieces.end());
    int64_t at = 0;
    bool tiled = true, whole_blocks = true;
    for (auto [start, size] : pieces) {
      if (start != at) tiled = false;  // a gap or an overlap
      if (start + size < rows && size % 128 != 0) whole_blocks = false;
      at = start + size;
    }
    INFO(src[i].name);
    REQUIRE(tiled);
    REQUIRE(at == rows);
    REQUIRE(whole_blocks);
  }
  return elems;
}

double Imbalance(const std::vector<int64_t>& elems) {
  int64_t total = 0;
  for (int64_t e : elems) total += e;
  return static_cast<double>(*std::max_element(elems.begin(), elems.end())) *
         static_cast<double>(elems.size()) / static_cast<double>(total);
}

TEST_CASE("aligned FSDP shards of DeepSeek-V3: every row held once, ranks evenly loaded") {
  // The full 671B config: its [2048, 7168] experts are 16 chunks; over 256 trainers all of them
  // sat on ranks 0-15 when every tensor started on rank 0.
  auto full = LoadModelConfig("tests/bench/deepseek_v3_671b.json");
  REQUIRE(full.ok());
  auto src = wb::engines::SourceTensors(*full);
  for (int world : {7, 16, 256}) {
    INFO("world " << world);
    const double rotated = Imbalance(AlignedShardElems(src, world, true));
    const double unrotated = Imbalance(AlignedShardElems(src, world, false));
    INFO("imbalance " << rotated << " (every tensor from rank 0: " << unrotated << ")");
    CHECK(rotated < 1.05);
    if (world == 256) CHECK(unrotated > 5);
  }
  // The small test model over 3 ranks: still every row once.
  AlignedShardElems(wb::engines::SourceTensors(Load("deepseek_v3")), 3, true);
}
