// Coalesced FP8 tiles: with FP8 destinations, FSDP trainers hold a tensor of fewer 128-row
// blocks than ranks whole (engines::DeploymentOptions::fp8_whole_small), so a row-parallel
// destination shard of it is one op of many 128x128 tiles with strided scales instead of one
// op per tile. Both layouts of a small DeepSeek-V3 (vLLM views: stacked experts, MLA, TP and
// EP) are planned, applied by the reference applier of plan_bytes.h to sources whose values
// depend only on the global position, and every destination byte (FP8 data and scales) must
// be the same.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/engines/dry_run.h"
#include "common/engines/model_config.h"
#include "common/planner/plan.h"
#include "tests/planner/plan_bytes.h"

using namespace wb::planner;
using namespace wb::planner::testing;

namespace {

// hidden 512: an expert's down_proj [512, 256] is 4 row blocks, fewer than the 8 trainers.
const char* kConfig = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 256,
  "num_hidden_layers": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 256,
  "kv_lora_rank": 256, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
  "topk_group": 1, "topk_method": "noaux_tc", "vocab_size": 1000,
  "tie_word_embeddings": false,
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
})";

// Destination buffers keyed by (agent, n-th region of the agent): region ids count the trainers'
// entries first, so they differ between two trainer layouts; the inference entries do not.
std::map<std::pair<int64_t, int64_t>, std::vector<uint8_t>> ByOrdinal(
    const std::vector<AgentLayout>& agents, const Buffers& dst) {
  std::map<std::pair<int64_t, int64_t>, std::vector<uint8_t>> out;
  for (size_t a = 0; a < agents.size(); ++a) {
    std::vector<uint64_t> seen;
    for (const TensorEntry& e : agents[a].tensors) {
      if (e.owner.role != Role::kInference) continue;
      if (std::find(seen.begin(), seen.end(), e.region) != seen.end()) continue;
      seen.push_back(e.region);
      out[{int64_t(a), int64_t(seen.size() - 1)}] = dst.at({int64_t(a), int64_t(e.region)});
    }
  }
  return out;
}

// Rows of the FP8 ops landing in destination tensors named `name`, over all executed ops.
std::vector<uint64_t> OpRows(const std::vector<AgentLayout>& agents, const Plan& plan,
                             const std::string& name) {
  std::vector<uint64_t> rows;
  for (int32_t a : plan.agent_order) {
    ForEachExecutedOp(plan, a, [&](const PlannedOp& op) {
      if (std::string(agents[op.dst_agent].tensors[op.dst_tensor].name) == name) {
        rows.push_back(op.rows);
      }
    });
  }
  return rows;
}

}  // namespace

TEST_CASE("coalesced FP8 tiles: whole small trainer tensors land the same bytes as tiles") {
  auto config = wb::engines::ParseModelConfig(kConfig, "test");
  INFO((config.ok() ? "" : std::string(config.status().message())));
  REQUIRE(config.ok());
  wb::engines::DeploymentOptions d;
  d.trainers = 8;
  d.fp8 = true;
  d.gpus_per_agent = 2;
  // TP 2 (128 columns of an expert's down_proj per rank), with and without EP, and TP 1 (the
  // whole 256 columns: two tiles per row block, two scales per scale row).
  const auto [tp, ep, gpus] =
      GENERATE(std::make_tuple(2, 1, 4), std::make_tuple(2, 2, 4), std::make_tuple(1, 1, 2));
  d.tp = tp, d.ep = ep, d.inference_gpus = gpus;
  INFO("tp " << tp << " ep " << ep);

  d.fp8_whole_small = false;
  auto tiled_agents = wb::engines::DeploymentLayouts(*config, d);
  d.fp8_whole_small = true;
  auto whole_agents = wb::engines::DeploymentLayouts(*config, d);
  REQUIRE(tiled_agents.ok());
  REQUIRE(whole_agents.ok());
  auto tiled = BuildPlan(*tiled_agents, PlanOptions{});
  auto whole = BuildPlan(*whole_agents, PlanOptions{});
  INFO((whole.ok() ? "" : std::string(whole.status().message()).substr(0, 2000)));
  REQUIRE(tiled.ok());
  REQUIRE(whole.ok());

  // The same bytes to the same receivers, in fewer ops.
  CHECK(whole->stats.total_bytes == tiled->stats.total_bytes);
  CHECK(whole->stats.recv_bytes == tiled->stats.recv_bytes);
  CHECK(whole->stats.total_ops < tiled->stats.total_ops);

  // A routed expert's down_proj: 4 row blocks on 4 trainers, one 128-row op each per
  // destination shard; held whole, one op of all 512 rows (4 x (256 / tp / 128) tiles).
  const std::string down = "model.layers.1.mlp.experts.3.down_proj.weight";
  const std::vector<uint64_t> tiled_rows = OpRows(*tiled_agents, *tiled, down);
  const std::vector<uint64_t> whole_rows = OpRows(*whole_agents, *whole, down);
  REQUIRE(!tiled_rows.empty());
  CHECK(tiled_rows.size() == 4 * whole_rows.size());
  for (uint64_t r : tiled_rows) CHECK(r == 128);
  for (uint64_t r : whole_rows) CHECK(r == 512);

  const Buffers a = Apply(*tiled_agents, *tiled, Sources(*tiled_agents));
  const Buffers b = Apply(*whole_agents, *whole, Sources(*whole_agents));
  const auto ka = ByOrdinal(*tiled_agents, a), kb = ByOrdinal(*whole_agents, b);
  REQUIRE(ka.size() == kb.size());
  uint64_t compared = 0, differing = 0, written = 0;
  for (const auto& [key, bytes] : ka) {
    INFO("agent " << key.first << " region " << key.second);
    const std::vector<uint8_t>& other = kb.at(key);
    REQUIRE(bytes.size() == other.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      ++compared;
      differing += bytes[i] != other[i];
      written += bytes[i] != 0xEE;
    }
  }
  CHECK(differing == 0);
  // Not vacuous: nearly every destination byte was written (vocab padding never is).
  CHECK(written > compared * 9 / 10);
}

TEST_CASE("coalesced FP8 tiles: BF16 destinations keep block-by-block trainer shards") {
  auto config = wb::engines::ParseModelConfig(kConfig, "test");
  REQUIRE(config.ok());
  wb::engines::DeploymentOptions d;
  d.trainers = 8, d.tp = 2, d.inference_gpus = 4, d.gpus_per_agent = 2;
  d.fp8 = false;  // fp8_whole_small only applies to FP8 destinations
  auto agents = wb::engines::DeploymentLayouts(*config, d);
  REQUIRE(agents.ok());
  int holders = 0;
  for (const AgentLayout& a : *agents) {
    for (const TensorEntry& e : a.tensors) {
      if (e.owner.role != Role::kTrainer) continue;
      if (std::string(e.name) != "model.layers.1.mlp.experts.3.down_proj.weight") continue;
      ++holders;
      CHECK(e.shard[0].size == 128);
    }
  }
  CHECK(holders == 4);
}
