// Planner behaviour on small hand-checked layouts: resharding ops, fusion offsets, expert
// parallel and replicated destinations, source balancing, determinism and the cost model.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>

#include "common/planner/plan.h"
#include "tests/planner/layout_builder.h"
#include "tests/planner/plan_checks.h"

using namespace wb::planner;
using namespace wb::planner::testing;

namespace {

const TensorEntry& DstOf(const std::vector<AgentLayout>& agents, const PlannedOp& op) {
  return agents[op.dst_agent].tensors[op.dst_tensor];
}

// The ops landing on inference rank `rank`, in plan order.
std::vector<std::pair<std::string, PlannedOp>> OpsToRank(
    const std::vector<AgentLayout>& agents,
    const std::vector<std::pair<std::string, PlannedOp>>& ops, int rank) {
  std::vector<std::pair<std::string, PlannedOp>> out;
  for (const auto& p : ops) {
    if (DstOf(agents, p.second).owner.rank == rank) out.push_back(p);
  }
  return out;
}

}  // namespace

TEST_CASE("dim-0 resharding: each destination slice reads contiguous runs from the owners") {
  // W [8, 16] bf16: trainers hold rows [0,4) and [4,8); the destination holds rows [2,6).
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {8, 16}, {{0, 4}, {0, 16}})
                    .Src("t1", 1, "W", {8, 16}, {{4, 4}, {0, 16}})
                    .Dst("i0", 0, 0, "W", {8, 16}, {{0, 2}, {0, 16}}, DTYPE_BF16, 0)
                    .Dst("i0", 0, 1, "W", {8, 16}, {{2, 4}, {0, 16}}, DTYPE_BF16, 1)
                    .Dst("i0", 0, 2, "W", {8, 16}, {{6, 2}, {0, 16}}, DTYPE_BF16, 2)
                    .Build();
  Plan plan = MustPlan(agents);
  CHECK(plan.stats.total_ops == 4);
  auto ops = OpsToRank(agents, AllOps(agents, plan), 1);
  REQUIRE(ops.size() == 2);
  CHECK(ops[0].first == "t0");
  CHECK(ops[0].second.rows == 1);
  CHECK(ops[0].second.row_elems == 32);
  CHECK(ops[0].second.src_offset == 2 * 16 * 2);
  CHECK(ops[0].second.dst_offset == 0);
  CHECK(ops[0].second.GetTransform() == weightbeam::v1::TRANSFORM_COPY);
  CHECK(ops[1].first == "t1");
  CHECK(ops[1].second.row_elems == 32);
  CHECK(ops[1].second.src_offset == 0);
  CHECK(ops[1].second.dst_offset == 2 * 16 * 2);
  CHECK(plan.stats.total_bytes == 8 * 16 * 2);
}

TEST_CASE("ranks holding an empty shard send and receive nothing, on any thread count") {
  // W [8, 16] over three trainers split 0 + 4 + 4 (an uneven FSDP split; the empty one listed
  // first), and a destination rank holding no rows beside the two that hold them all.
  auto agents = LayoutBuilder()
                    .Src("t2", 2, "W", {8, 16}, {{8, 0}, {0, 16}})
                    .Src("t0", 0, "W", {8, 16}, {{0, 4}, {0, 16}})
                    .Src("t1", 1, "W", {8, 16}, {{4, 4}, {0, 16}})
                    .Dst("i0", 0, 0, "W", {8, 16}, {{0, 5}, {0, 16}}, DTYPE_BF16, 0)
                    .Dst("i0", 0, 1, "W", {8, 16}, {{5, 3}, {0, 16}}, DTYPE_BF16, 1)
                    .Dst("i0", 0, 2, "W", {8, 16}, {{8, 0}, {0, 16}}, DTYPE_BF16, 2)
                    .Build();
  uint64_t hash = 0;
  for (int threads : {1, 3}) {
    INFO("threads " << threads);
    PlanOptions options;
    options.threads = threads;
    Plan plan = MustPlan(agents, options);
    CHECK(plan.stats.total_bytes == 8 * 16 * 2);
    CHECK(plan.stats.total_ops == 3);      // t0: rows 0-3; t1: row 4, then rows 5-7
    CHECK(plan.stats.send_bytes[0] == 0);  // t2
    CHECK(plan.stats.send_bytes[1] == 4 * 16 * 2);
    CHECK(plan.stats.send_bytes[2] == 4 * 16 * 2);
    CHECK(plan.stats.recv_bytes[3] == 8 * 16 * 2);
    for (const auto& [agent, op] : AllOps(agents, plan)) CHECK(op.rows * op.row_elems > 0);
    if (hash == 0) hash = plan.hash;
    CHECK(plan.hash == hash);
  }
}

TEST_CASE("dim-1 resharding: a row-parallel destination gets strided rows from each owner") {
  // W [8, 16]: trainers hold rows [0,4) and [4,8); the destination holds columns [4, 12).
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {8, 16}, {{0, 4}, {0, 16}})
                    .Src("t1", 1, "W", {8, 16}, {{4, 4}, {0, 16}})
                    .Dst("i0", 0, 0, "W", {8, 16}, {{0, 8}, {0, 4}}, DTYPE_BF16, 0)
                    .Dst("i0", 0, 1, "W", {8, 16}, {{0, 8}, {4, 8}}, DTYPE_BF16, 1)
                    .Dst("i0", 0, 2, "W", {8, 16}, {{0, 8}, {12, 4}}, DTYPE_BF16, 2)
                    .Build();
  Plan plan = MustPlan(agents);
  CHECK(plan.stats.total_ops == 6);
  auto ops = OpsToRank(agents, AllOps(agents, plan), 1);
  REQUIRE(ops.size() == 2);
  for (int k = 0; k < 2; ++k) {
    const PlannedOp& op = ops[k].second;
    CHECK(op.rows == 4);
    CHECK(op.row_elems == 8);
    CHECK(op.src_offset == 4 * 2);
    CHECK(op.src_stride == 16 * 2);
    CHECK(op.dst_stride == 8 * 2);
    CHECK(op.dst_offset == static_cast<uint64_t>(k * 4 * 8 * 2));
  }
}

TEST_CASE("a cast destination converts on the way and lands in its own dtype's bytes") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "norm", {64}, {}, DTYPE_F32)
                    .Dst("i0", 0, 0, "norm", {64}, {}, DTYPE_BF16)
                    .Build();
  Plan plan = MustPlan(agents);
  auto ops = AllOps(agents, plan);
  REQUIRE(ops.size() == 1);
  CHECK(ops[0].second.GetTransform() == weightbeam::v1::TRANSFORM_CAST);
  CHECK(ops[0].second.DstBytes() == 128);
}

TEST_CASE("fusion: q, k and v land at their offsets of qkv_proj, split across TP ranks") {
  // q [4, 8], k [2, 8], v [2, 8] -> qkv [8, 8]; TP rank 0 holds rows [0,4), rank 1 [4,8).
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "l.q_proj.weight", {4, 8})
                    .Src("t0", 0, "l.k_proj.weight", {2, 8})
                    .Src("t0", 0, "l.v_proj.weight", {2, 8})
                    .Dst("i0", 0, 0, "l.qkv_proj.weight", {8, 8}, {{0, 4}, {0, 8}}, DTYPE_BF16, 0)
                    .Dst("i0", 0, 1, "l.qkv_proj.weight", {8, 8}, {{4, 4}, {0, 8}}, DTYPE_BF16, 1)
                    .Build();
  Plan plan = MustPlanFused(agents);
  auto ops = AllOps(agents, plan);
  REQUIRE(ops.size() == 3);
  std::map<std::string, std::pair<int, uint64_t>> where;  // source -> (TP rank, dst offset)
  for (const auto& [agent, op] : ops) {
    const std::string& src = agents[op.src_agent].tensors[op.src_tensor].name;
    where[src] = {DstOf(agents, op).owner.rank, op.dst_offset};
    CHECK(op.row_elems == (src == "l.q_proj.weight" ? 32u : 16u));
    CHECK(op.src_offset == 0);
  }
  CHECK(where["l.q_proj.weight"] == std::make_pair(0, uint64_t{0}));
  CHECK(where["l.k_proj.weight"] == std::make_pair(1, uint64_t{0}));
  CHECK(where["l.v_proj.weight"] == std::make_pair(1, uint64_t{2 * 8 * 2}));
}

TEST_CASE("rename rules map source names onto destination names") {
  PlanOptions options;
  options.renames = {{R"(module\.(.*))", R"(\1)"}};
  auto agents =
      LayoutBuilder().Src("t0", 0, "module.W", {4, 4}).Dst("i0", 0, 0, "W", {4, 4}).Build();
  Plan plan = MustPlan(agents, options);
  auto ops = AllOps(agents, plan);
  REQUIRE(ops.size() == 1);
  CHECK(agents[ops[0].second.src_agent].tensors[ops[0].second.src_tensor].name == "module.W");
}

TEST_CASE("expert-parallel destinations receive only their experts, whole") {
  // Two experts of [4, 8], FSDP-split over two trainers; inference EP rank e holds expert e.
  LayoutBuilder b;
  for (int e = 0; e < 2; ++e) {
    std::string n = "mlp.experts." + std::to_string(e) + ".down_proj.weight";
    b.Src("t0", 0, n, {4, 8}, {{0, 2}, {0, 8}}).Src("t1", 1, n, {4, 8}, {{2, 2}, {0, 8}});
    b.Dst("i0", 0, e, n, {4, 8}, {}, DTYPE_BF16, e);
  }
  auto agents = b.Build();
  Plan plan = MustPlan(agents);
  auto ops = AllOps(agents, plan);
  REQUIRE(ops.size() == 4);
  for (const auto& [agent, op] : ops) {
    const TensorEntry& dst = DstOf(agents, op);
    const TensorEntry& src = agents[op.src_agent].tensors[op.src_tensor];
    CHECK(dst.name == src.name);
    CHECK(dst.owner.rank == (dst.name.str().find(".0.") != std::string::npos ? 0 : 1));
    CHECK(op.dst_offset == (agent == "t0" ? 0u : 2u * 8 * 2));
    CHECK(op.row_elems == 16);
  }
  REQUIRE(plan.stats.receiver_device_bytes.size() == 2);
  CHECK(plan.stats.receiver_device_bytes[0] == 4 * 8 * 2);
  CHECK(plan.stats.receiver_device_bytes[1] == 4 * 8 * 2);
}

TEST_CASE("every inference replica receives its own full copy") {
  LayoutBuilder b;
  b.Src("t0", 0, "W", {8, 8});
  for (int r = 0; r < 3; ++r) {
    b.Dst("i" + std::to_string(r), r, 0, "W", {8, 8}, {{0, 4}, {0, 8}});
    b.Dst("i" + std::to_string(r), r, 1, "W", {8, 8}, {{4, 4}, {0, 8}}, DTYPE_BF16, 1);
  }
  auto agents = b.Build();
  Plan plan = MustPlan(agents);
  CHECK(plan.stats.total_ops == 6);
  CHECK(plan.stats.total_bytes == 3 * 8 * 8 * 2);
  for (size_t a = 1; a < agents.size(); ++a) CHECK(plan.stats.recv_bytes[a] == 8 * 8 * 2);
}

TEST_CASE("balancing: replicas holding the same shard share the sending evenly") {
  // Two trainer replicas (agents tA, tB) each hold all tensors; 4 inference replicas pull
  // them. Greedy largest-first keeps max <= mean + the largest op.
  LayoutBuilder b;
  const std::vector<int64_t> rows = {64, 48, 40, 32, 16, 8, 8, 4};
  for (size_t k = 0; k < rows.size(); ++k) {
    std::string n = "W" + std::to_string(k);
    b.Src("tA", 0, n, {rows[k], 32}, {}, DTYPE_BF16, 0, 0);
    b.Src("tB", 1, n, {rows[k], 32}, {}, DTYPE_BF16, 1, 0);
    for (int r = 0; r < 4; ++r) b.Dst("i" + std::to_string(r), r, 0, n, {rows[k], 32});
  }
  auto agents = b.Build();
  Plan plan = MustPlan(agents);
  uint64_t total = 0, largest = 0;
  for (int64_t r : rows) total += 4 * r * 32 * 2, largest = std::max<uint64_t>(largest, r * 32 * 2);
  CHECK(plan.stats.total_bytes == total);
  const uint64_t a = plan.stats.send_bytes[0], c = plan.stats.send_bytes[1];
  CHECK(a + c == total);
  CHECK(std::max(a, c) <= total / 2 + largest);
  CHECK(plan.stats.sender_imbalance <= 1.0 + double(largest) / (total / 2.0));
  CHECK(a > 0);
  CHECK(c > 0);
}

TEST_CASE("determinism: same input, same hash; shuffled agents and tensors, same plan") {
  LayoutBuilder b;
  b.Nics("t0", 2).Nics("t1", 2);
  for (int k = 0; k < 6; ++k) {
    std::string n = "model.layers." + std::to_string(k) + ".W";
    b.Src("t0", 0, n, {16, 8}, {{0, 8}, {0, 8}}, DTYPE_BF16, 0, 0)
        .Src("t1", 1, n, {16, 8}, {{8, 8}, {0, 8}}, DTYPE_BF16, 0, 1)
        .Src("t1", 2, n, {16, 8}, {{0, 8}, {0, 8}}, DTYPE_BF16, 1, 0)
        .Src("t0", 3, n, {16, 8}, {{8, 8}, {0, 8}}, DTYPE_BF16, 1, 1);
    for (int r = 0; r < 2; ++r) {
      b.Dst("i" + std::to_string(r), r, 0, n, {16, 8}, {{0, 16}, {0, 4}});
      b.Dst("i" + std::to_string(r), r, 1, n, {16, 8}, {{0, 16}, {4, 4}}, DTYPE_BF16, 1);
    }
  }
  PlanOptions options;
  options.layers_per_phase = 2;
  auto agents = b.Build();
  Plan p1 = MustPlan(agents, options);
  Plan p2 = MustPlan(agents, options);
  CHECK(p1.hash_hex == p2.hash_hex);
  CHECK(p1.phases == 3);

  auto shuffled = agents;
  std::mt19937 rng(7);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (AgentLayout& a : shuffled) std::shuffle(a.tensors.begin(), a.tensors.end(), rng);
  Plan p3 = MustPlan(shuffled, options);
  CHECK(p3.hash_hex == p1.hash_hex);
  auto o1 = AllOps(agents, p1);
  auto o3 = AllOps(shuffled, p3);
  REQUIRE(o1.size() == o3.size());
  for (size_t i = 0; i < o1.size(); ++i) {
    const PlannedOp &x = o1[i].second, &y = o3[i].second;
    CHECK(o1[i].first == o3[i].first);
    CHECK(agents[x.dst_agent].name == shuffled[y.dst_agent].name);
    CHECK(agents[x.src_agent].tensors[x.src_tensor].name ==
          shuffled[y.src_agent].tensors[y.src_tensor].name);
    CHECK(DstOf(agents, x).owner.rank == DstOf(shuffled, y).owner.rank);
    CHECK(x.src_offset == y.src_offset);
    CHECK(x.dst_offset == y.dst_offset);
    CHECK(x.rail == y.rail);
    CHECK(x.phase == y.phase);
  }
  // A different layout gives a different hash.
  agents[0].tensors[0].region += 100;
  CHECK(MustPlan(agents, options).hash_hex != p1.hash_hex);
}

TEST_CASE("phases group layers and ops run phase by phase") {
  LayoutBuilder b;
  for (int k : {0, 1, 2, 3, 10}) {
    std::string n = "model.layers." + std::to_string(k) + ".W";
    b.Src("t0", 0, n, {4, 4}).Dst("i0", 0, 0, n, {4, 4});
  }
  b.Src("t0", 0, "model.embed_tokens.weight", {4, 4})
      .Dst("i0", 0, 0, "model.embed_tokens.weight", {4, 4});
  PlanOptions options;
  options.layers_per_phase = 2;
  auto agents = b.Build();
  Plan plan = MustPlan(agents, options);
  CHECK(plan.phases == 6);
  std::vector<int> phases;
  for (const PlannedOp& op : ExecutedOps(plan, 0)) phases.push_back(op.phase);
  CHECK(phases == std::vector<int>{0, 0, 0, 1, 1, 5});
}

TEST_CASE("cost model: the step is the busiest rail, bytes over bandwidth plus op overhead") {
  // t0 sends 2 ops of 1 MB (2 rails, one GPU per rail); the receiver has one 10 GB/s rail.
  LayoutBuilder b;
  b.Nics("t0", 2, 50).Nics("i0", 1, 10);
  b.Src("t0", 0, "A", {512, 1024}, {}, DTYPE_BF16, 0, 0);
  b.Src("t0", 1, "B", {512, 1024}, {}, DTYPE_BF16, 0, 1);
  b.Dst("i0", 0, 0, "A", {512, 1024}).Dst("i0", 0, 0, "B", {512, 1024});
  PlanOptions options;
  options.cost.op_overhead_us = 10;
  auto agents = b.Build();
  Plan plan = MustPlan(agents, options);
  auto ops = AllOps(agents, plan);
  REQUIRE(ops.size() == 2);
  CHECK(ops[0].second.rail != ops[1].second.rail);  // GPU 0 -> rail 0, GPU 1 -> rail 1
  // Receiver: 2 MiB at 10 GB/s dominates 1 MiB / 50 GB/s + 10 us on each sender rail.
  CHECK(plan.stats.predicted_step_seconds == Approx(2.0 * 1048576 / 10e9));
}

TEST_CASE("rails: a GPU with two NICs alternates them; host memory may use every rail") {
  // Agent t0: 4 NICs, GPUs 0 and 1 -> GPU 0 uses rails {0, 2}, GPU 1 rails {1, 3}.
  LayoutBuilder b;
  b.Nics("t0", 4);
  for (int k = 0; k < 4; ++k) {
    std::string n = "G" + std::to_string(k);
    b.Src("t0", 0, n, {64, 64}, {}, DTYPE_BF16, 0, 0).Dst("i0", 0, 0, n, {64, 64});
  }
  b.Src("t0", 1, "H", {64, 64}, {}, DTYPE_BF16, 0, 1).Dst("i0", 0, 0, "H", {64, 64});
  b.Src("t0", 2, "M", {64, 64}, {}, DTYPE_BF16, 0, -1).Dst("i0", 0, 0, "M", {64, 64});
  auto agents = b.Build();
  Plan plan = MustPlan(agents);
  std::map<std::string, int> rail;
  for (const PlannedOp& op : ExecutedOps(plan, 0)) {
    rail[agents[0].tensors[op.src_tensor].name] = op.rail;
  }
  CHECK(rail["G0"] == 0);
  CHECK(rail["G1"] == 2);
  CHECK(rail["G2"] == 0);
  CHECK(rail["G3"] == 2);
  CHECK(rail["H"] == 1);
  CHECK(rail["M"] == 3);  // host memory: the least loaded of all rails
}
