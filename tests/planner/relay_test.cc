// Relays (relay.h): later inference replicas take their bytes from an earlier replica's agent.
// A plan with relays delivers exactly the bytes of the plan without them: the senders' ops
// (ForEachSentOp) are applied to the sources, then every relay's ops (RelayOps), parents before
// children, copy from the relay's destination buffers into its children's, and every
// destination byte is compared with the direct plan applied by the reference applier of
// plan_bytes.h (dense and FP8, chains and trees over 4+ replicas). The cost model relays a
// trainer-bound fleet and leaves a receiver-bound one as it was.
#include "common/planner/relay.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>

#include "common/planner/models.h"
#include "common/planner/plan.h"
#include "tests/planner/plan_bytes.h"

using namespace wb::planner;
using namespace wb::planner::testing;

namespace {

PlanOptions Fused() {
  PlanOptions o;
  o.fusions = DefaultFusionRules();
  return o;
}

ModelSpec SmallDense() {
  Qwen3Config c = Qwen3_0_6B();
  c.layers = 2, c.vocab = 4096;
  return BuildQwen3("dense", c);
}

ModelSpec SmallMoe() {
  Qwen3Config c = Qwen3_0_6B();
  c.layers = 2, c.vocab = 2048, c.hidden = 512, c.experts = 4, c.moe_intermediate = 384;
  return BuildQwen3("moe", c);
}

// Senders' ops, then relays level by level (a child's position is always after its parent's,
// so positions in increasing order apply every parent first). Counts the relay ops applied.
Buffers ApplyWithRelays(const std::vector<AgentLayout>& full, const std::vector<AgentLayout>& input,
                        const Plan& plan, const Buffers& sources, uint64_t* relay_ops) {
  Buffers dst = FreshDestinations(full);
  for (int32_t a : plan.agent_order) {
    ForEachSentOp(plan, a, [&](const PlannedOp& op) {
      REQUIRE(op.relay == 0);
      ApplyOp(full, op, sources.at({op.src_agent, op.src_tensor}), &dst);
    });
  }
  std::vector<int32_t> order(full.size());
  for (size_t a = 0; a < order.size(); ++a) order[a] = static_cast<int32_t>(a);
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
    return plan.relay.family_pos[x] < plan.relay.family_pos[y];
  });
  *relay_ops = 0;
  for (int32_t a : order) {
    for (const PlannedOp& op : RelayOps(input, plan, a)) {
      ++*relay_ops;
      REQUIRE(op.relay == 1);
      REQUIRE(op.src_agent == a);
      REQUIRE(RelayParent(plan, op.dst_agent) == a);
      REQUIRE(op.rows == 1);
      REQUIRE(op.row_elems <= kRelayChunkBytes);
      const std::vector<uint8_t>& from = dst.at({a, full[a].tensors[op.src_tensor].region});
      std::vector<uint8_t>& to =
          dst.at({op.dst_agent, full[op.dst_agent].tensors[op.dst_tensor].region});
      REQUIRE(op.src_offset + op.row_elems <= from.size());
      REQUIRE(op.dst_offset + op.row_elems <= to.size());
      std::memcpy(to.data() + op.dst_offset, from.data() + op.src_offset, op.row_elems);
    }
  }
  return dst;
}

uint64_t Differing(const Buffers& a, const Buffers& b, uint64_t* written) {
  REQUIRE(a.size() == b.size());
  uint64_t differing = 0;
  *written = 0;
  for (const auto& [key, bytes] : a) {
    const std::vector<uint8_t>& other = b.at(key);
    REQUIRE(bytes.size() == other.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      differing += bytes[i] != other[i];
      *written += bytes[i] != 0xEE;
    }
  }
  return differing;
}

// Plans `full` folded into mirrors with the tree (roots, fanout) forced and compares every
// destination byte with the plan without relays.
void CompareForcedTree(const std::vector<AgentLayout>& full, int roots, int fanout, int replicas) {
  std::vector<AgentLayout> folded = full;
  REQUIRE(FoldMirrors(&folded) > 0);
  PlanOptions options = Fused();
  auto direct = BuildPlan(folded, options);
  REQUIRE(direct.ok());
  options.relays.enabled = true;
  options.relays.roots = roots;
  options.relays.fanout = fanout;
  auto relayed = BuildPlan(folded, options);
  INFO((relayed.ok() ? "" : std::string(relayed.status().message())));
  REQUIRE(relayed.ok());
  const RelayTree& tree = relayed->relay;
  REQUIRE(tree.roots == roots);
  REQUIRE(tree.fanout == fanout);
  CHECK(relayed->hash != direct->hash);  // the tree is part of the plan

  // Every family has one member per replica; positions >= roots have a parent one level up.
  int relayed_agents = 0, families = 0;
  for (size_t a = 0; a < full.size(); ++a) {
    if (tree.family_head[a] != static_cast<int32_t>(a) || tree.families[a].size() < 2) continue;
    ++families;
    CHECK(static_cast<int>(tree.families[a].size()) == replicas);
    for (int32_t member : tree.families[a]) {
      const int32_t pos = tree.family_pos[member];
      const int32_t parent = RelayParent(*relayed, member);
      if (pos < roots) {
        CHECK(parent == -1);
        continue;
      }
      ++relayed_agents;
      REQUIRE(parent >= 0);
      CHECK(tree.family_pos[parent] == (pos - roots) / fanout);
      const std::vector<int32_t> siblings = RelayChildren(*relayed, parent);
      CHECK(std::count(siblings.begin(), siblings.end(), member) == 1);
      CHECK(static_cast<int>(siblings.size()) <= fanout);
    }
  }
  REQUIRE(families > 0);
  CHECK(relayed_agents == families * (replicas - roots));
  CHECK(tree.depth >= 1);
  CHECK(tree.relayed_bytes > 0);

  // The senders send less: nothing to relayed agents.
  uint64_t sent = 0, executed = 0;
  for (int32_t a : relayed->agent_order) {
    ForEachSentOp(*relayed, a, [&](const PlannedOp& op) {
      ++sent;
      CHECK_FALSE(IsRelayed(*relayed, op.dst_agent));
    });
    ForEachExecutedOp(*relayed, a, [&](const PlannedOp&) { ++executed; });
  }
  CHECK(sent < executed);

  const Buffers sources = Sources(full);
  const Buffers want = Apply(full, *direct, sources);
  uint64_t relay_ops = 0, written = 0;
  const Buffers got = ApplyWithRelays(full, folded, *relayed, sources, &relay_ops);
  CHECK(Differing(want, got, &written) == 0);
  CHECK(written > 0);
  CHECK(relay_ops > 0);
  // Landed ops coalesce into runs: a relay executes fewer ops than land in it.
  CHECK(relay_ops < executed - sent);
}

}  // namespace

TEST_CASE("relays: forced chains and trees over 5 replicas deliver the direct plan's bytes") {
  const bool fp8 = GENERATE(false, true);
  const auto [roots, fanout] = GENERATE(table<int, int>({{1, 1}, {1, 2}, {2, 1}, {2, 3}, {1, 4}}));
  INFO("fp8 " << fp8 << " roots " << roots << " fanout " << fanout);
  TrainerOptions tr;
  tr.ranks = 4, tr.gpus_per_agent = 2;
  InferenceOptions inf;
  inf.gpus = 10, inf.tp = 2, inf.fp8 = fp8, inf.gpus_per_agent = 2;  // five replicas of TP 2
  auto agents = BuildLayouts(SmallDense(), tr, inf);
  REQUIRE(agents.ok());
  CompareForcedTree(*agents, roots, fanout, 5);
}

TEST_CASE("relays: MoE with inference TP 4 / EP 2 over 4 replicas, FP8, a tree of fan-out 2") {
  TrainerOptions tr;
  tr.ranks = 8, tr.ep = 2, tr.gpus_per_agent = 4;
  InferenceOptions inf;
  inf.gpus = 16, inf.tp = 4, inf.ep = 2, inf.gpus_per_agent = 4;  // four replicas
  auto agents = BuildLayouts(SmallMoe(), tr, inf);
  REQUIRE(agents.ok());
  CompareForcedTree(*agents, 1, 2, 4);
}

TEST_CASE("relays: the cost model relays a trainer-bound fleet, not a receiver-bound one") {
  PlanOptions options = Fused();
  options.relays.enabled = true;

  SECTION("one trainer node feeding eight replicas: relayed, faster, never below the limit") {
    TrainerOptions tr;
    tr.ranks = 2, tr.gpus_per_agent = 2;
    InferenceOptions inf;
    inf.gpus = 16, inf.tp = 2, inf.gpus_per_agent = 2;
    auto agents = BuildLayouts(SmallDense(), tr, inf);
    REQUIRE(agents.ok());
    REQUIRE(FoldMirrors(&*agents) > 0);
    auto direct = BuildPlan(*agents, Fused());
    auto plan = BuildPlan(*agents, options);
    REQUIRE(direct.ok());
    REQUIRE(plan.ok());
    const RelayTree& tree = plan->relay;
    CHECK(tree.roots > 0);
    CHECK(tree.direct_predicted_seconds == Approx(direct->stats.predicted_step_seconds));
    CHECK(tree.predicted_seconds < tree.direct_predicted_seconds / 2);
    CHECK(tree.predicted_seconds >= tree.receiver_limit_seconds);
    CHECK(plan->stats.predicted_step_seconds == tree.predicted_seconds);
    // The trainers' link carries a fraction of what it carried: the roots' bytes.
    uint64_t direct_sent = 0, relayed_sent = 0;
    for (size_t a = 0; a < agents->size(); ++a) {
      if (!direct->stats.is_sender[a]) continue;
      direct_sent += direct->stats.send_bytes[a];
      relayed_sent += plan->stats.send_bytes[a];
    }
    CHECK(relayed_sent * 2 < direct_sent);
    CHECK(plan->stats.total_bytes == direct->stats.total_bytes);  // every byte still moves once
  }

  SECTION("sixteen trainers into two replicas: receiver-bound, the plan is unchanged") {
    TrainerOptions tr;
    tr.ranks = 16, tr.gpus_per_agent = 1, tr.nics_per_agent = 1;
    InferenceOptions inf;
    inf.gpus = 4, inf.tp = 2, inf.gpus_per_agent = 2, inf.nics_per_agent = 1;
    auto agents = BuildLayouts(SmallDense(), tr, inf);
    REQUIRE(agents.ok());
    REQUIRE(FoldMirrors(&*agents) > 0);
    auto direct = BuildPlan(*agents, Fused());
    auto plan = BuildPlan(*agents, options);
    REQUIRE(direct.ok());
    REQUIRE(plan.ok());
    CHECK(plan->relay.roots == 0);
    CHECK(plan->hash == direct->hash);
    CHECK(plan->stats.predicted_step_seconds == direct->stats.predicted_step_seconds);
    CHECK(plan->stats.send_bytes == direct->stats.send_bytes);
    CHECK(plan->relay.relayed_bytes == 0);
  }

  SECTION("forcing as many roots as replicas is no relay at all") {
    TrainerOptions tr;
    tr.ranks = 2, tr.gpus_per_agent = 2;
    InferenceOptions inf;
    inf.gpus = 8, inf.tp = 2, inf.gpus_per_agent = 2;
    auto agents = BuildLayouts(SmallDense(), tr, inf);
    REQUIRE(agents.ok());
    REQUIRE(FoldMirrors(&*agents) > 0);
    options.relays.roots = 4, options.relays.fanout = 2;
    auto plan = BuildPlan(*agents, options);
    auto direct = BuildPlan(*agents, Fused());
    REQUIRE(plan.ok());
    REQUIRE(direct.ok());
    CHECK(plan->relay.roots == 0);
    CHECK(plan->hash == direct->hash);
  }
}

TEST_CASE("relays: DeepSeek (MLA, replicated q_a / kv_a, experts) TP 4 over 4 replicas, FP8") {
  DeepSeekV3Config c = KimiK2();
  c.hidden = 512, c.layers = 2, c.intermediate = 1024, c.experts = 4, c.moe_intermediate = 256;
  c.heads = 4, c.q_lora_rank = 256, c.kv_lora_rank = 256, c.vocab = 1024;
  TrainerOptions tr;
  tr.ranks = 8;
  InferenceOptions inf;
  inf.gpus = 16, inf.tp = 4, inf.gpus_per_agent = 4;  // a replica per agent
  auto agents = BuildLayouts(BuildDeepSeekV3("deepseek", c), tr, inf);
  REQUIRE(agents.ok());
  const auto [roots, fanout] = GENERATE(table<int, int>({{1, 1}, {1, 3}, {2, 2}}));
  INFO("roots " << roots << " fanout " << fanout);
  CompareForcedTree(*agents, roots, fanout, 4);
}
