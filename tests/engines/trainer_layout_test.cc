// Trainer layouts from config.json: Megatron-core (per-group QKV, [gate_r; up_r] fc1, padded
// vocab, TE-fused norm names, grouped / sequential experts, MLA, PP stages) and DTensor
// placements (FSDP2 torch.chunk, HSDP, TP-major _StridedShard, EP over fused v5 experts). The
// coverage checks count, per HF element, how many ranks of one data-parallel copy hold it.
#include "common/engines/trainer_layout.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"

namespace {

using wb::engines::DTensorLayout;
using wb::engines::DTensorOptions;
using wb::engines::LoadModelConfig;
using wb::engines::MegatronLayout;
using wb::engines::MegatronOptions;
using wb::engines::ModelConfig;
using wb::engines::ParsePlacements;
using wb::engines::PlacementRule;
using wb::engines::SourceTensor;
using wb::engines::SourceTensors;
using wb::engines::TrainerTensor;
using Shape = std::vector<int64_t>;

ModelConfig Load(const std::string& family) {
  auto c = LoadModelConfig("tests/python/engine_configs/" + family + ".json");
  REQUIRE(c.ok());
  return *c;
}

std::map<std::string, TrainerTensor> ByName(const std::vector<TrainerTensor>& tensors) {
  std::map<std::string, TrainerTensor> out;
  for (const TrainerTensor& t : tensors) {
    INFO(t.name);
    CHECK(out.count(t.name) == 0);
    out[t.name] = t;
  }
  return out;
}

std::map<std::string, TrainerTensor> Megatron(const ModelConfig& c, MegatronOptions o) {
  auto t = MegatronLayout(c, o);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  return ByName(*t);
}

std::string MegatronError(const ModelConfig& c, MegatronOptions o) {
  auto t = MegatronLayout(c, o);
  REQUIRE_FALSE(t.ok());
  return std::string(t.status().message());
}

int64_t Volume(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Per HF tensor, how often each element is held; also checks that every part lies inside its
// trainer tensor and that no two parts of one tensor share an element.
class Coverage {
 public:
  explicit Coverage(const ModelConfig& c) {
    for (const SourceTensor& s : SourceTensors(c)) {
      shapes_[s.name] = s.shape;
      counts_[s.name].assign(static_cast<size_t>(Volume(s.shape)), 0);
    }
  }

  // Plain loops (no assertion per element: these layouts have millions of elements).
  void Add(const TrainerTensor& t) {
    std::vector<int> local(static_cast<size_t>(Volume(t.shape)), 0);
    for (const auto& p : t.parts) {
      INFO(t.name << " <- " << p.source);
      REQUIRE(shapes_.count(p.source) == 1);
      REQUIRE(p.source_shape == shapes_[p.source]);
      REQUIRE(p.box.size() == p.source_shape.size());
      REQUIRE(p.offset.size() == t.shape.size());
      const size_t lead = t.shape.size() - p.box.size();
      const bool two_d = p.box.size() == 2;
      const int64_t rows = two_d ? p.box[0].size : 1;
      const int64_t cols = p.box.back().size;
      // Row-major strides of the trainer tensor; the box's rows and columns map onto its last
      // dims, the leading dims hold the offset.
      std::vector<int64_t> stride(t.shape.size(), 1);
      for (size_t d = t.shape.size() - 1; d-- > 0;) stride[d] = stride[d + 1] * t.shape[d + 1];
      bool inside = true, once = true;
      int64_t base = 0;
      for (size_t d = 0; d < t.shape.size(); ++d) {
        base += p.offset[d] * stride[d];
        inside = inside && p.offset[d] >= 0 && p.offset[d] < t.shape[d];
      }
      if (two_d) inside = inside && p.offset[lead] + rows <= t.shape[lead];
      inside = inside && p.offset.back() + cols <= t.shape.back();
      std::vector<int>& counts = counts_[p.source];
      const int64_t row_stride = two_d ? stride[lead] : 0;
      for (int64_t r = 0; r < rows && inside && once; ++r) {
        const int64_t src0 =
            two_d ? (p.box[0].start + r) * p.source_shape[1] + p.box[1].start : p.box[0].start;
        const int64_t dst0 = base + r * row_stride;
        for (int64_t k = 0; k < cols; ++k) {
          once = once && ++local[static_cast<size_t>(dst0 + k)] == 1;
          ++counts[static_cast<size_t>(src0 + k)];
        }
      }
      CHECK(inside);
      CHECK(once);
    }
  }

  // Every element of `name` held exactly `times` times.
  bool Exactly(const std::string& name, int times) const {
    for (int n : counts_.at(name)) {
      if (n != times) return false;
    }
    return true;
  }

  const std::map<std::string, Shape>& shapes() const { return shapes_; }

 private:
  std::map<std::string, Shape> shapes_;
  std::map<std::string, std::vector<int>> counts_;
};

bool Replicated(const std::string& hf) {
  for (const char* s :
       {"layernorm.weight", "model.norm.weight", "norm.weight", "mlp.gate.weight",
        "e_score_correction_bias", "q_a_proj.weight", "kv_a_proj_with_mqa.weight"}) {
    if (absl::EndsWith(hf, s)) return true;
  }
  return false;
}

bool IsExpert(const std::string& trainer_name) {
  return absl::StrContains(trainer_name, ".mlp.experts.");
}

// Every rank of one data-parallel copy: dense tensors over tp x pp, experts over ep x etp x pp.
void CheckMegatronCoverage(const std::string& family, int tp, int pp, int ep, int etp) {
  const ModelConfig c = Load(family);
  Coverage cov(c);
  for (int s = 0; s < pp; ++s) {
    for (int r = 0; r < tp; ++r) {
      MegatronOptions o;
      o.tp = tp, o.tp_rank = r, o.pp = pp, o.pp_rank = s, o.ep = ep, o.etp = etp;
      for (const auto& [name, t] : Megatron(c, o)) {
        if (!IsExpert(name)) cov.Add(t);
      }
    }
    for (int e = 0; e < ep; ++e) {
      for (int x = 0; x < etp; ++x) {
        MegatronOptions o;
        o.tp = tp, o.pp = pp, o.pp_rank = s, o.ep = ep, o.ep_rank = e, o.etp = etp;
        o.etp_rank = x;
        for (const auto& [name, t] : Megatron(c, o)) {
          if (IsExpert(name)) cov.Add(t);
        }
      }
    }
  }
  for (const auto& [name, shape] : cov.shapes()) {
    INFO(family << " tp " << tp << " pp " << pp << " ep " << ep << " etp " << etp << ": " << name);
    const bool expert = absl::StrContains(name, ".mlp.experts.");
    // Tied embeddings over stages: the first stage's embedding and the last stage's own
    // output_layer.weight both hold model.embed_tokens.weight.
    const bool tied_twice = c.tie_embeddings && pp > 1 && name == "model.embed_tokens.weight";
    CHECK(cov.Exactly(name, Replicated(name) && !expert ? tp : tied_twice ? 2 : 1));
  }
}

TEST_CASE("megatron: every HF element held once per data-parallel copy (replicated: tp times)") {
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    for (int tp : {1, 2}) {
      if (std::string(family) == "qwen2" && tp == 2) continue;  // 1 query group
      for (int pp : {1, 2}) {
        if (std::string(family) == "qwen3" && pp == 2) continue;  // 3 layers
        CheckMegatronCoverage(family, tp, pp, 1, 1);
      }
    }
  }
  CheckMegatronCoverage("qwen3", 1, 3, 1, 1);
  CheckMegatronCoverage("llama", 2, 1, 1, 1);
  for (const char* family : {"qwen3_moe", "deepseek_v3"}) {
    for (int tp : {1, 2, 4}) {
      if (std::string(family) == "qwen3_moe" && tp == 4) continue;  // 2 query groups
      for (int ep : {1, 2, 4}) {
        for (int etp : {1, 2}) CheckMegatronCoverage(family, tp, 2, ep, etp);
      }
    }
  }
}

TEST_CASE("megatron: linear_qkv interleaves [q heads; k; v] per query group") {
  // Llama: 8 heads, 2 groups, head_dim 64: a group is 4 q heads + k + v = 384 rows.
  MegatronOptions o;
  o.tp = 2;
  o.tp_rank = 1;
  auto t = Megatron(Load("llama"), o);
  const TrainerTensor& qkv = t.at("decoder.layers.1.self_attention.linear_qkv.weight");
  CHECK(qkv.shape == Shape{384, 256});
  REQUIRE(qkv.parts.size() == 3);
  CHECK(qkv.parts[0].source == "model.layers.1.self_attn.q_proj.weight");
  CHECK(qkv.parts[0].box[0].start == 256);  // group 1's heads 4..7
  CHECK(qkv.parts[0].box[0].size == 256);
  CHECK(qkv.parts[1].source == "model.layers.1.self_attn.k_proj.weight");
  CHECK(qkv.parts[1].box[0].start == 64);
  CHECK(qkv.parts[1].offset == Shape{256, 0});
  CHECK(qkv.parts[2].offset == Shape{320, 0});
  CHECK(t.at("decoder.layers.1.self_attention.linear_proj.weight").shape == Shape{256, 256});
  CHECK(t.at("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight").parts[0].source ==
        "model.layers.0.input_layernorm.weight");
  CHECK(t.at("decoder.layers.0.mlp.linear_fc1.layer_norm_weight").parts[0].source ==
        "model.layers.0.post_attention_layernorm.weight");
  // fc1 = [gate rows of r; up rows of r]
  const TrainerTensor& fc1 = t.at("decoder.layers.0.mlp.linear_fc1.weight");
  CHECK(fc1.shape == Shape{512, 256});
  CHECK(fc1.parts[1].source == "model.layers.0.mlp.up_proj.weight");
  CHECK(fc1.parts[1].box[0].start == 256);
  CHECK(fc1.parts[1].offset == Shape{256, 0});
  // Qwen3 (4 groups of 2 heads, head_dim 128) at tp 2: two groups per rank, 6 parts.
  o.tp_rank = 0;
  auto q = Megatron(Load("qwen3"), o);
  CHECK(q.at("decoder.layers.0.self_attention.linear_qkv.weight").parts.size() == 6);
  CHECK(q.at("decoder.layers.0.self_attention.linear_qkv.weight").parts[3].offset == Shape{512, 0});
  CHECK(q.at("decoder.layers.0.self_attention.q_layernorm.weight").shape == Shape{128});
  // Qwen2 bias, interleaved the same way.
  auto b = Megatron(Load("qwen2"), MegatronOptions{});
  // Qwen2: one group of 8 heads of 32 and k, v.
  CHECK(b.at("decoder.layers.0.self_attention.linear_qkv.bias").shape == Shape{320});
  CHECK(b.at("decoder.layers.0.self_attention.linear_qkv.bias").parts[2].offset == Shape{288});
}

TEST_CASE("a tensor registers as a plain shard only when one part fills it") {
  MegatronOptions o;
  o.tp = 2;
  auto t = Megatron(Load("llama"), o);
  using wb::engines::FillsTensor;
  // A norm: one part, the whole of it. A row-parallel proj: one part, but a column slice of
  // the HF tensor fills the trainer tensor (offset 0, its whole shape): still plain.
  CHECK(FillsTensor(t.at("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight")));
  CHECK(FillsTensor(t.at("decoder.layers.1.self_attention.linear_proj.weight")));
  // Fused q / k / v and gate / up: views of the trainer tensor.
  CHECK_FALSE(FillsTensor(t.at("decoder.layers.1.self_attention.linear_qkv.weight")));
  CHECK_FALSE(FillsTensor(t.at("decoder.layers.0.mlp.linear_fc1.weight")));
  // One part at an offset, or short of the shape (vocab padding rows), is a view too.
  TrainerTensor padded;
  padded.shape = {8, 4};
  padded.parts.push_back({"embed", {6, 4}, {{0, 6}, {0, 4}}, {0, 0}});
  CHECK_FALSE(FillsTensor(padded));
  padded.parts[0].box[0].size = 8;
  padded.parts[0].source_shape = {8, 4};
  CHECK(FillsTensor(padded));
  padded.parts[0].offset = {0, 1};
  CHECK_FALSE(FillsTensor(padded));
}

TEST_CASE("megatron: vocab padded to make_vocab_size_divisible_by x tp, pipeline stages") {
  MegatronOptions o;
  o.tp = 2, o.pp = 2;
  o.tp_rank = 1;
  auto first = Megatron(Load("llama"), o);  // vocab 1000 -> 1024, 512 per rank
  const TrainerTensor& emb = first.at("embedding.word_embeddings.weight");
  CHECK(emb.shape == Shape{512, 256});
  CHECK(emb.parts[0].box[0].start == 512);
  CHECK(emb.parts[0].box[0].size == 488);
  CHECK(first.count("output_layer.weight") == 0);
  CHECK(first.count("decoder.layers.1.self_attention.linear_qkv.weight") == 0);
  o.pp_rank = 1;
  auto last = Megatron(Load("llama"), o);
  CHECK(last.count("embedding.word_embeddings.weight") == 0);
  CHECK(last.at("output_layer.weight").shape == Shape{512, 256});
  CHECK(last.at("decoder.layers.0.mlp.linear_fc2.weight").parts[0].source ==
        "model.layers.1.mlp.down_proj.weight");
  CHECK(last.count("decoder.final_layernorm.weight") == 1);
  o.vocab_divisible_by = 1;
  CHECK(Megatron(Load("llama"), o).at("output_layer.weight").shape == Shape{500, 256});
  // Tied embeddings: no output layer.
  MegatronOptions tied;
  CHECK(Megatron(Load("qwen3"), tied).count("output_layer.weight") == 0);
  // Uneven stages: an explicit layer list, numbered from 0.
  MegatronOptions uneven;
  uneven.pp = 2, uneven.pp_rank = 1, uneven.stage_layers_given = true;
  uneven.stage_layers = {1, 2};
  auto s = Megatron(Load("qwen3"), uneven);
  CHECK(s.at("decoder.layers.1.mlp.linear_fc1.weight").parts[0].source ==
        "model.layers.2.mlp.gate_proj.weight");
  CHECK(s.count("decoder.layers.2.mlp.linear_fc1.weight") == 0);
  // Tied, on the last of two stages: Megatron-core's own copy of the embedding, padded and
  // split like it (issue 42).
  const TrainerTensor& head = s.at("output_layer.weight");
  CHECK(head.shape == Shape{1024, 256});  // vocab 1000 padded to a multiple of 128
  REQUIRE(head.parts.size() == 1);
  CHECK(head.parts[0].source == "model.embed_tokens.weight");
  CHECK(head.parts[0].box[0].size == 1000);
  CHECK(s.count("decoder.final_layernorm.weight") == 1);
  uneven.pp_rank = 0, uneven.stage_layers = {0};
  CHECK(Megatron(Load("qwen3"), uneven).count("output_layer.weight") == 0);  // the first stage
}

TEST_CASE("megatron: MoE experts, router, expert_bias, shared experts and MLA names") {
  MegatronOptions o;
  o.tp = 2, o.ep = 2, o.ep_rank = 1, o.etp = 2, o.etp_rank = 1;
  auto t = Megatron(Load("qwen3_moe"), o);
  CHECK(t.at("decoder.layers.0.pre_mlp_layernorm.weight").parts[0].source ==
        "model.layers.0.post_attention_layernorm.weight");
  CHECK(t.at("decoder.layers.0.mlp.router.weight").shape == Shape{8, 256});
  const TrainerTensor& fc1 = t.at("decoder.layers.0.mlp.experts.linear_fc1.weight3");
  CHECK(fc1.shape == Shape{1024, 256});
  CHECK(fc1.parts[0].source == "model.layers.0.mlp.experts.7.gate_proj.weight");
  CHECK(fc1.parts[0].box[0].start == 512);
  CHECK(t.at("decoder.layers.0.mlp.experts.linear_fc2.weight3").shape == Shape{256, 512});
  CHECK(t.count("decoder.layers.0.mlp.experts.linear_fc1.weight4") == 0);
  o.sequential_experts = true;
  CHECK(Megatron(Load("qwen3_moe"), o)
            .count("decoder.layers.0.mlp.experts.local_experts.0."
                   "linear_fc1.weight") == 1);

  MegatronOptions d;
  d.tp = 2, d.tp_rank = 1;
  auto ds = Megatron(Load("deepseek_v3"), d);
  CHECK(ds.at("decoder.layers.1.mlp.router.expert_bias").dtype == wb::engines::DType::DTYPE_F32);
  CHECK(ds.at("decoder.layers.1.mlp.router.expert_bias").parts[0].source ==
        "model.layers.1.mlp.gate.e_score_correction_bias");
  CHECK(ds.at("decoder.layers.1.mlp.shared_experts.linear_fc1.weight").shape == Shape{1024, 256});
  CHECK(ds.at("decoder.layers.0.mlp.linear_fc1.layer_norm_weight").shape == Shape{256});
  CHECK(ds.at("decoder.layers.0.input_layernorm.weight").shape == Shape{256});
  CHECK(ds.at("decoder.layers.0.self_attention.linear_q_down_proj.weight").shape ==
        Shape{256, 256});
  CHECK(ds.at("decoder.layers.0.self_attention.linear_q_up_proj.weight").shape ==
        Shape{8 * 192, 256});
  CHECK(
      ds.at("decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight").parts[0].source ==
      "model.layers.0.self_attn.q_a_layernorm.weight");
  CHECK(ds.at("decoder.layers.0.self_attention.linear_kv_down_proj.weight").shape ==
        Shape{320, 256});
  CHECK(ds.at("decoder.layers.0.self_attention.linear_kv_up_proj.weight").shape ==
        Shape{8 * 256, 256});
  CHECK(ds.at("decoder.layers.0.self_attention.linear_proj.weight").shape == Shape{256, 1024});
}

TEST_CASE("megatron: settings that do not fit the model are one error naming the tensor") {
  MegatronOptions o;
  o.tp = 4;
  CHECK(MegatronError(Load("llama"), o) ==
        "tp 4 does not divide num_query_groups 2 (num_key_value_heads; "
        "decoder.layers.0.self_attention.linear_qkv.weight)");
  o.tp = 1, o.pp = 2;
  CHECK(MegatronError(Load("qwen3"), o) ==
        "pp 2 does not divide num_hidden_layers 3 (decoder.layers); give each stage's layers "
        "for an uneven split");
  o.pp = 1, o.ep = 3;
  CHECK(MegatronError(Load("qwen3_moe"), o) ==
        "ep 3 does not divide the 8 experts (mlp.experts.linear_fc1.weight)");
  o.ep = 2, o.ep_rank = 2;
  CHECK(MegatronError(Load("qwen3_moe"), o) ==
        "ep_rank 2 is not in [0, ep 2) (ep must be 1 to 65536)");
  o.ep = 1, o.ep_rank = 0, o.etp = 3;
  CHECK(MegatronError(Load("qwen3_moe"), o) ==
        "etp 3 does not divide moe_intermediate_size 1024 (mlp.experts.linear_fc1.weight)");
  o.etp = 2;
  CHECK(MegatronError(Load("llama"), o) == "ep 1 and etp 2: the model has no experts");
  MegatronOptions bad;
  bad.stage_layers_given = true;
  bad.stage_layers = {1, 0};
  CHECK(absl::StartsWith(MegatronError(Load("llama"), bad), "stage layers [1, 0] of pp rank 0"));
}

std::map<std::string, TrainerTensor> DTensor(const ModelConfig& c, DTensorOptions o) {
  auto t = DTensorLayout(c, o);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  return ByName(*t);
}

PlacementRule Rule(const std::string& pattern, const std::string& placements) {
  auto p = ParsePlacements(placements);
  REQUIRE(p.ok());
  return {pattern, *p};
}

TEST_CASE("dtensor: FSDP2 chunks dim 0 like torch.chunk, trailing ranks short or empty") {
  DTensorOptions o;
  o.mesh = {3};
  o.rules = {Rule("*", "S(0)")};
  const ModelConfig c = Load("qwen2");  // vocab 130: chunks of 44, 44, 42
  Coverage cov(c);
  for (int r = 0; r < 3; ++r) {
    o.coords = {r};
    auto t = DTensor(c, o);
    CHECK(t.at("model.embed_tokens.weight").shape == Shape{r < 2 ? 44 : 42, 256});
    for (const auto& [name, tensor] : t) cov.Add(tensor);
  }
  for (const auto& [name, shape] : cov.shapes()) CHECK(cov.Exactly(name, 1));
  o.mesh = {1000};
  o.coords = {999};  // past the last row of a 256-element norm: empty
  auto t = DTensor(c, o);
  CHECK(t.at("model.norm.weight").shape == Shape{0});
  CHECK(t.at("model.norm.weight").parts.empty());
}

TEST_CASE("dtensor: HSDP replicas and FSDP + TP with TP-major strided blocks") {
  const ModelConfig c = Load("llama");
  DTensorOptions o;
  o.mesh = {2, 2};  // (replicate, shard)
  o.rules = {Rule("*", "R,S(0)")};
  Coverage hsdp(c);
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) {
      o.coords = {a, b};
      for (const auto& [name, tensor] : DTensor(c, o)) hsdp.Add(tensor);
    }
  }
  for (const auto& [name, shape] : hsdp.shapes()) CHECK(hsdp.Exactly(name, 2));
  // (dp, tp): colwise Shard(0) over tp cut first, then FSDP's strided Shard(0).
  o.rules = {Rule("*q_proj.weight", "SS(0),S(0)"), Rule("*o_proj.weight", "S(0),S(1)"),
             Rule("*norm*", "S(0),R")};
  o.coords = {1, 0};  // dp 1, tp 0: rows [128, 256) of tp 0's [0, 256)
  auto t = DTensor(c, o);
  const TrainerTensor& q = t.at("model.layers.0.self_attn.q_proj.weight");
  CHECK(q.shape == Shape{128, 256});
  CHECK(q.parts[0].box[0].start == 128);
  const TrainerTensor& out = t.at("model.layers.0.self_attn.o_proj.weight");
  CHECK(out.parts[0].box[0].start == 128);
  CHECK(out.parts[0].box[1].start == 0);
  CHECK(out.shape == Shape{128, 256});
  o.coords = {0, 1};
  CHECK(DTensor(c, o).at("model.layers.0.self_attn.q_proj.weight").parts[0].box[0].start == 256);
}

TEST_CASE("dtensor: EP over Transformers-v5 fused experts") {
  const ModelConfig c = Load("qwen3_moe");  // 8 experts, moe_intermediate 1024
  DTensorOptions o;
  o.mesh = {2, 2};  // (ep, fsdp)
  o.fused_experts = true;
  o.rules = {Rule("*.experts.*", "S(0),S(1)"), Rule("*", "R,S(0)")};
  Coverage cov(c);
  for (int e = 0; e < 2; ++e) {
    for (int f = 0; f < 2; ++f) {
      o.coords = {e, f};
      auto t = DTensor(c, o);
      CHECK(t.count("model.layers.0.mlp.experts.0.gate_proj.weight") == 0);
      const TrainerTensor& gu = t.at("model.layers.0.mlp.experts.gate_up_proj");
      CHECK(gu.shape == Shape{4, 1024, 256});
      // fsdp 0 holds gate rows only, fsdp 1 up rows only.
      CHECK(gu.parts.size() == 4);
      CHECK(absl::EndsWith(gu.parts[0].source, f == 0 ? "gate_proj.weight" : "up_proj.weight"));
      CHECK(gu.parts[1].offset == Shape{1, 0, 0});
      CHECK(t.at("model.layers.0.mlp.experts.down_proj").shape == Shape{4, 128, 1024});
      for (const auto& [name, tensor] : t) {
        if (absl::StrContains(name, ".experts.")) cov.Add(tensor);
      }
    }
  }
  for (const auto& [name, shape] : cov.shapes()) {
    if (absl::StrContains(name, ".experts.")) CHECK(cov.Exactly(name, 1));
  }
  o.rules = {Rule("*", "S(0)")};
  auto bad = DTensorLayout(c, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() ==
        "placements 'S(0)' for '*' name 1 mesh dimension(s); the mesh has 2");
  CHECK_FALSE(ParsePlacements("Shard(x)").ok());
  CHECK(wb::engines::GlobMatch("*.experts.*", "a.experts.b"));
  CHECK_FALSE(wb::engines::GlobMatch("*q_proj.weight", "a.q_proj.bias"));
}

TEST_CASE("megatron and dtensor settings past their limits are refused, naming the field") {
  // Issue 41, item 7: 2^62 x tp 4 wrapped to 0, then the vocab was divided by it (SIGFPE).
  ModelConfig c = Load("llama");
  c.kv_heads = 4;  // tp 4 divides the heads: the vocab padding is what is left to check
  MegatronOptions o;
  o.tp = 4;
  o.vocab_divisible_by = int64_t{1} << 62;
  auto huge = MegatronLayout(c, o);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(huge.status().message()),
             Catch::Contains("make_vocab_size_divisible_by 4611686018427387904 must be 1 to " +
                             std::to_string(wb::engines::kMaxVocabDivisibleBy)));
  o.vocab_divisible_by = wb::engines::kMaxVocabDivisibleBy;  // the limit itself is fine
  CHECK(MegatronLayout(c, o).ok());
  o.vocab_divisible_by = 0;
  CHECK_FALSE(MegatronLayout(c, o).ok());
  o.vocab_divisible_by = 128;
  o.tp = wb::engines::kMaxLayoutParallel + 1;
  auto tp = MegatronLayout(c, o);
  REQUIRE_FALSE(tp.ok());
  CHECK_THAT(std::string(tp.status().message()), Catch::Contains("tp must be 1 to 65536"));

  DTensorOptions d;
  d.mesh = {1};
  d.coords = {0};
  d.rules = {Rule(std::string(wb::engines::kMaxLayoutPattern + 1, '*'), "R")};
  auto pattern = DTensorLayout(Load("llama"), d);
  REQUIRE_FALSE(pattern.ok());
  CHECK_THAT(std::string(pattern.status().message()),
             Catch::Contains("pattern of 1025 characters"));
  d.rules.assign(wb::engines::kMaxLayoutRules + 1, Rule("x", "R"));
  auto rules = DTensorLayout(Load("llama"), d);
  REQUIRE_FALSE(rules.ok());
  CHECK_THAT(std::string(rules.status().message()), Catch::Contains("placement rules: at most"));
}

}  // namespace
