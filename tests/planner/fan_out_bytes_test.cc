// Fan-out plans (PlanOptions::fan_out, one op per destination class) deliver exactly the bytes
// of the old one-op-per-destination plans: both are applied to the same source buffers by the
// reference applier of plan_bytes.h and every destination byte is compared. Layouts: dense Qwen3
// with fused qkv / gate_up (BF16 and FP8), a Qwen3-MoE with TP / EP on both sides, a DeepSeek (MLA,
// replicated tensors) and vLLM engine views.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "common/engines/dry_run.h"
#include "common/engines/model_config.h"
#include "common/planner/models.h"
#include "common/planner/plan.h"
#include "tests/planner/layout_builder.h"
#include "tests/planner/plan_bytes.h"

using namespace wb::planner;
using namespace wb::planner::testing;

namespace {

// Every op a plan executes, per sender, as sortable fields (the rail aside: it is assigned per
// held op).
using OpKey = std::tuple<int32_t, int32_t, int32_t, uint64_t, uint64_t, uint64_t, uint64_t,
                         uint64_t, uint64_t, int32_t, uint64_t, uint32_t, int16_t, uint8_t>;
std::vector<std::vector<OpKey>> ExecutedSorted(const Plan& plan) {
  std::vector<std::vector<OpKey>> out(plan.ops.size());
  for (size_t a = 0; a < plan.ops.size(); ++a) {
    ForEachExecutedOp(plan, static_cast<int32_t>(a), [&](const PlannedOp& op) {
      out[a].emplace_back(op.src_tensor, op.dst_agent, op.dst_tensor, op.src_offset, op.src_stride,
                          op.dst_offset, op.dst_stride, op.rows, op.row_elems, op.scale_tensor,
                          op.scale_offset, op.scale_stride, op.phase, op.transform);
    });
    std::sort(out[a].begin(), out[a].end());
  }
  return out;
}

// Plans `agents` both ways and compares every destination byte. `siblings`: the layout has
// tensor-parallel column shards whose sources hold whole rows on one holder each, so some
// fan-out destinations are siblings reading shifted source columns (Destination::src_shift),
// and every sender executes exactly the one-op-per-destination plan's ops.
void CompareBothWays(const std::vector<AgentLayout>& agents, PlanOptions options, bool siblings) {
  options.fan_out = false;
  auto fine = BuildPlan(agents, options);
  INFO((fine.ok() ? "" : std::string(fine.status().message()).substr(0, 2000)));
  REQUIRE(fine.ok());
  options.fan_out = true;
  auto coarse = BuildPlan(agents, options);
  REQUIRE(coarse.ok());

  CHECK(fine->stats.plan_ops == fine->stats.total_ops);
  CHECK(fine->fanout_dsts.empty());
  // The fan-out plan holds fewer ops (every layout here has two or more inference replicas)
  // and executes the same number.
  CHECK(coarse->stats.plan_ops < coarse->stats.total_ops);
  CHECK(coarse->stats.total_ops == fine->stats.total_ops);
  CHECK(coarse->stats.total_bytes == fine->stats.total_bytes);
  // Source replicas are balanced per op, so senders may differ; receivers get the same.
  CHECK(coarse->stats.recv_bytes == fine->stats.recv_bytes);

  uint64_t shifted = 0;
  for (const Destination& d : coarse->fanout_dsts) shifted += d.src_shift != 0;
  if (siblings) {
    CHECK(shifted > 0);
    CHECK(ExecutedSorted(*coarse) == ExecutedSorted(*fine));
  } else {
    CHECK(shifted == 0);
  }

  const Buffers sources = Sources(agents);
  const Buffers a = Apply(agents, *fine, sources);
  const Buffers b = Apply(agents, *coarse, sources);
  REQUIRE(a.size() == b.size());
  uint64_t compared = 0, differing = 0, written = 0;
  for (const auto& [key, bytes] : a) {
    const std::vector<uint8_t>& other = b.at(key);
    REQUIRE(bytes.size() == other.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      ++compared;
      differing += bytes[i] != other[i];
      written += bytes[i] != 0xEE;
    }
  }
  CHECK(differing == 0);
  // Not vacuous: nearly every destination byte was written (0xEE can also be a real value;
  // vocab padding of engine buffers is never written).
  CHECK(written > compared * 9 / 10);

  // Replica mirrors (layout.h): the same layouts with every repeating inference agent folded
  // into a mirror of an earlier one, planned on 1 and 3 threads, deliver the same bytes as the
  // one-op-per-destination plan of the full layouts (the mirrors' ops address the same agent
  // and entry indices, so they are applied to the full layouts' buffers).
  std::vector<AgentLayout> folded = agents;
  CHECK(FoldMirrors(&folded) > 0);  // every layout here has repeating inference agents
  for (int threads : {1, 3}) {
    options.threads = threads;
    auto mirrored = BuildPlan(folded, options);
    REQUIRE(mirrored.ok());
    CHECK(mirrored->hash == coarse->hash);
    // Groups list a template's entry once for its mirrors (Plan::fanout_mirrored).
    CHECK(std::count(mirrored->fanout_mirrored.begin(), mirrored->fanout_mirrored.end(), 1) > 0);
    CHECK(mirrored->fanout_dsts.size() < coarse->fanout_dsts.size());
    CHECK(mirrored->stats.total_ops == fine->stats.total_ops);
    const Buffers m = Apply(agents, *mirrored, sources);
    uint64_t mirror_differing = 0;
    for (const auto& [key, bytes] : a) {
      const std::vector<uint8_t>& other = m.at(key);
      REQUIRE(bytes.size() == other.size());
      for (size_t i = 0; i < bytes.size(); ++i) mirror_differing += bytes[i] != other[i];
    }
    CHECK(mirror_differing == 0);
  }
}

PlanOptions FusedOptions() {
  PlanOptions o;
  o.fusions = DefaultFusionRules();
  return o;
}

// CompareBothWays on the generated layouts of `model` (fusion rules applied).
void CompareModelBothWays(const ModelSpec& model, const TrainerOptions& tr,
                          const InferenceOptions& inf) {
  auto agents = BuildLayouts(model, tr, inf);
  REQUIRE(agents.ok());
  // Replicated trainers offer a choice of holder per op: no siblings then.
  CompareBothWays(*agents, FusedOptions(), tr.replicas == 1);
}

}  // namespace

TEST_CASE("fan-out: dense Qwen3 with fused qkv / gate_up, BF16 and FP8, same bytes") {
  const bool fp8 = GENERATE(false, true);
  const int trainer_replicas = GENERATE(1, 2);
  Qwen3Config c = Qwen3_0_6B();
  c.layers = 2, c.vocab = 4096;
  TrainerOptions tr;
  tr.ranks = 4, tr.replicas = trainer_replicas, tr.gpus_per_agent = 2;
  InferenceOptions inf;
  inf.gpus = 6, inf.tp = 2, inf.fp8 = fp8, inf.gpus_per_agent = 2;  // three replicas of TP 2
  CompareModelBothWays(BuildQwen3("small", c), tr, inf);
}

TEST_CASE("fan-out: Qwen3-MoE with trainer EP and inference TP 4 / EP 2, FP8, same bytes") {
  Qwen3Config c = Qwen3_0_6B();
  c.layers = 2, c.vocab = 2048, c.hidden = 512, c.experts = 4, c.moe_intermediate = 384;
  TrainerOptions tr;
  tr.ranks = 8, tr.ep = 2, tr.gpus_per_agent = 4;
  InferenceOptions inf;
  inf.gpus = 8, inf.tp = 4, inf.ep = 2, inf.gpus_per_agent = 4;  // two replicas
  CompareModelBothWays(BuildQwen3("moe", c), tr, inf);
}

TEST_CASE("fan-out: DeepSeek (MLA, replicated q_a / kv_a) TP 4, FP8, same bytes") {
  DeepSeekV3Config c = KimiK2();
  c.hidden = 512, c.layers = 2, c.intermediate = 1024, c.experts = 4, c.moe_intermediate = 256;
  c.heads = 4, c.q_lora_rank = 256, c.kv_lora_rank = 256, c.vocab = 1024;
  TrainerOptions tr;
  tr.ranks = 8;
  InferenceOptions inf;
  inf.gpus = 8, inf.tp = 4, inf.gpus_per_agent = 4;  // a replica per agent: foldable
  CompareModelBothWays(BuildDeepSeekV3("deepseek", c), tr, inf);
}

TEST_CASE("fan-out: TP siblings out of column order, uneven splits and replicated trainers") {
  // Three inference replicas of two ranks, each replica on its own agent.
  SECTION("siblings") {
    // W [8, 16], whole rows on two trainers; rank 0 holds the right half, so its sibling's
    // shift is negative. V [8, 12] is split 8 + 4: shapes differ, no siblings.
    LayoutBuilder b;
    for (int t = 0; t < 2; ++t) {
      const std::string agent = "t" + std::to_string(t);
      b.Src(agent, t, "W", {8, 16}, {{4 * t, 4}, {0, 16}});
      b.Src(agent, t, "V", {8, 12}, {{4 * t, 4}, {0, 12}});
    }
    for (int r = 0; r < 3; ++r) {
      const std::string agent = "i" + std::to_string(r);
      b.Dst(agent, r, 0, "W", {8, 16}, {{0, 8}, {8, 8}}, DTYPE_BF16, 0);
      b.Dst(agent, r, 1, "W", {8, 16}, {{0, 8}, {0, 8}}, DTYPE_BF16, 1);
      b.Dst(agent, r, 0, "V", {8, 12}, {{0, 8}, {0, 8}}, DTYPE_BF16, 0);
      b.Dst(agent, r, 1, "V", {8, 12}, {{0, 8}, {8, 4}}, DTYPE_BF16, 1);
    }
    const std::vector<AgentLayout> agents = b.Build();
    CompareBothWays(agents, PlanOptions{}, true);
    auto plan = BuildPlan(agents, PlanOptions{});
    REQUIRE(plan.ok());
    // W's group: rank 0 of each replica, then rank 1 reading 8 columns (16 bytes) to the left.
    int negative = 0;
    for (const Destination& d : plan->fanout_dsts) {
      CHECK((d.src_shift == 0 || d.src_shift == -16));
      negative += d.src_shift == -16;
    }
    CHECK(negative == 3);
    // W: one op per trainer row block; V: 2 row blocks x 2 classes.
    CHECK(plan->stats.plan_ops == 2 + 4);
  }
  SECTION("replicated trainers") {
    // R [8, 16] whole on two trainer replicas: each op chooses its holder, no siblings.
    LayoutBuilder b;
    for (int t = 0; t < 2; ++t) b.Src("t" + std::to_string(t), 0, "R", {8, 16}, {}, DTYPE_BF16, t);
    for (int r = 0; r < 3; ++r) {
      const std::string agent = "i" + std::to_string(r);
      b.Dst(agent, r, 0, "R", {8, 16}, {{0, 8}, {0, 8}}, DTYPE_BF16, 0);
      b.Dst(agent, r, 1, "R", {8, 16}, {{0, 8}, {8, 8}}, DTYPE_BF16, 1);
    }
    CompareBothWays(b.Build(), PlanOptions{}, false);
  }
}

TEST_CASE("fan-out: a tensor every replica holds is cut over its holders, same bytes") {
  // R [64, 64] whole on four trainer replicas (data-parallel copies); U<t> [64, 64] only on
  // trainer t. Sixteen inference replicas hold R and every U<t>. R's one fan-out op (16
  // destinations) would cost one holder as much as all of its own U: the planner cuts R's
  // destinations over the four holders, so every trainer sends the same bytes.
  LayoutBuilder b;
  for (int t = 0; t < 4; ++t) {
    const std::string agent = "t" + std::to_string(t);
    b.Src(agent, 0, "R", {64, 64}, {}, DTYPE_BF16, t);
    b.Src(agent, 0, "U" + std::to_string(t), {64, 64}, {}, DTYPE_BF16, t);
  }
  for (int r = 0; r < 16; ++r) {
    const std::string agent = "i" + std::to_string(r);
    b.Dst(agent, r, 0, "R", {64, 64});
    for (int t = 0; t < 4; ++t) b.Dst(agent, r, 0, "U" + std::to_string(t), {64, 64});
  }
  const std::vector<AgentLayout> agents = b.Build();
  auto plan = BuildPlan(agents, PlanOptions{});
  REQUIRE(plan.ok());
  // Every trainer sends its U to 16 replicas and R to 4 of them: 20 x 8 KiB.
  int r_senders = 0;
  for (size_t a = 0; a < agents.size(); ++a) {
    if (agents[a].tensors.empty() || agents[a].tensors[0].owner.role != Role::kTrainer) continue;
    INFO(agents[a].name);
    CHECK(plan->stats.send_bytes[a] == 20u * 64 * 64 * 2);
    for (const PlannedOp& op : plan->ops[a]) {
      r_senders += std::string(agents[a].tensors[op.src_tensor].name) == "R";
    }
  }
  CHECK(r_senders == 4);
  CHECK(plan->stats.sender_imbalance == Approx(1.0));
  // Same bytes as one op per destination, folded (mirrors) or not.
  CompareBothWays(agents, PlanOptions{}, false);
}

TEST_CASE("fan-out: vLLM engine views of a DeepSeek-V3 config (stacked experts, FP8), same bytes") {
  const char* json = R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 256, "intermediate_size": 1024, "moe_intermediate_size": 256,
    "num_hidden_layers": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 256,
    "kv_lora_rank": 256, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
    "topk_group": 1, "topk_method": "noaux_tc", "vocab_size": 1000,
    "tie_word_embeddings": false,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
  })";
  auto config = wb::engines::ParseModelConfig(json, "test");
  INFO((config.ok() ? "" : std::string(config.status().message())));
  REQUIRE(config.ok());
  wb::engines::DeploymentOptions d;
  d.trainers = 4;
  d.inference_gpus = 4;  // two replicas of TP 2
  d.tp = 2;
  d.ep = GENERATE(1, 2);
  d.fp8 = true;
  d.gpus_per_agent = 2;
  auto agents = wb::engines::DeploymentLayouts(*config, d);
  INFO((agents.ok() ? "" : std::string(agents.status().message())));
  REQUIRE(agents.ok());
  CompareBothWays(*agents, PlanOptions{}, true);
}
