// Validation: every kind of bad layout is rejected with a message naming the tensor, the
// shapes or slices and who holds them; several problems are reported together.
#include <catch2/catch.hpp>

#include "common/planner/plan.h"
#include "tests/planner/layout_builder.h"
#include "tests/planner/plan_checks.h"

using namespace wb::planner;
using namespace wb::planner::testing;

TEST_CASE("a destination with no source is named with its holder") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "A", {4})
                    .Dst("i0", 0, 0, "A", {4})
                    .Dst("i0", 0, 0, "B", {4})
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- destination B (inference replica 0 rank 0 on agent i0) has no source tensor");
}

TEST_CASE("a shape mismatch names both shapes and who holds them") {
  auto agents = LayoutBuilder().Src("t0", 3, "W", {4, 8}).Dst("i0", 1, 2, "W", {8, 4}).Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- shape mismatch for W: destination [8, 4] on inference replica 1 rank 2 on agent i0, "
        "source W [4, 8] bf16 on trainer rank 3 on agent t0");
}

TEST_CASE("a dtype pair with no transform is rejected") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "ids", {4}, {}, DTYPE_I32)
                    .Dst("i0", 0, 0, "ids", {4}, {}, DTYPE_BF16)
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- no transform from i32 to bf16 for destination ids (inference replica 0 rank 0 on "
        "agent i0, source ids [4] i32 on trainer rank 0 on agent t0)");
}

TEST_CASE("overlapping source shards are rejected, naming both holders and slices") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {8, 4}, {{0, 5}, {0, 4}})
                    .Src("t1", 1, "W", {8, 4}, {{4, 4}, {0, 4}})
                    .Dst("i0", 0, 0, "W", {8, 4})
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- shards of W overlap among the trainers: trainer rank 0 on agent t0 holds [0:5, 0:4] "
        "and trainer rank 1 on agent t1 holds [4:8, 0:4]");
}

TEST_CASE("destination shards that leave holes are rejected with the missing rows") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {8, 4})
                    .Dst("i0", 0, 0, "W", {8, 4}, {{0, 3}, {0, 4}})
                    .Dst("i0", 0, 1, "W", {8, 4}, {{5, 3}, {0, 4}})
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- shards of W [8, 4] among inference replica 0 leave holes: rows [3, 5) held by no "
        "rank");
}

TEST_CASE("a fusion with a missing part names the missing tensor") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "l.q_proj.weight", {4, 8})
                    .Src("t0", 0, "l.k_proj.weight", {2, 8})
                    .Dst("i0", 0, 0, "l.qkv_proj.weight", {8, 8})
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- fused destination l.qkv_proj.weight (inference replica 0 rank 0 on agent i0): fusion "
        "part(s) missing: l.v_proj.weight");
}

TEST_CASE("a fusion whose parts do not concatenate to the destination is rejected") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "l.q_proj.weight", {4, 8})
                    .Src("t0", 0, "l.k_proj.weight", {2, 6})
                    .Src("t0", 0, "l.v_proj.weight", {2, 8})
                    .Dst("i0", 0, 0, "l.qkv_proj.weight", {8, 8})
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- fused destination l.qkv_proj.weight [8, 8] on inference replica 0 rank 0 on agent i0: "
        "parts are inconsistent with a concat along dim 0; l.q_proj.weight [4, 8] bf16 on "
        "trainer rank 0 on agent t0; l.k_proj.weight [2, 6] bf16 on trainer rank 0 on agent t0; "
        "l.v_proj.weight [2, 8] bf16 on trainer rank 0 on agent t0");
}

TEST_CASE("an FP8 destination without its scale tensor is rejected") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "l.o_proj.weight", {256, 256})
                    .Dst("i0", 0, 0, "l.o_proj.weight", {256, 256}, {}, DTYPE_F8_E4M3)
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- FP8 destination l.o_proj.weight (inference replica 0 rank 0 on agent i0) has no scale "
        "tensor l.o_proj.weight_scale_inv");
}

TEST_CASE("an FP8 scale tensor of the wrong shape is rejected") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {256, 300})
                    .Dst("i0", 0, 0, "W", {256, 300}, {}, DTYPE_F8_E4M3)
                    .Dst("i0", 0, 0, "W_scale_inv", {2, 2}, {}, DTYPE_F32)
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- FP8 scale tensor W_scale_inv is f32 [2, 2] but W [256, 300] needs f32 [2, 3] (one "
        "scale per 128x128 block)");
}

TEST_CASE("inconsistent registrations and bad shards are named") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {8, 4}, {{0, 4}, {0, 4}})
                    .Src("t1", 1, "W", {8, 5}, {{4, 4}, {0, 5}})
                    .Src("t1", 1, "X", {8}, {{6, 4}})
                    .Dst("i0", 0, 0, "W", {8, 4})
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 2 problems:\n"
        "- tensor X (trainer rank 1 on agent t1): shard [6:10] lies outside the global shape "
        "[8]\n"
        "- tensor W is registered inconsistently: bf16 [8, 4] on trainer rank 0 on agent t0 but "
        "bf16 [8, 5] on trainer rank 1 on agent t1");
}

TEST_CASE("a region too small for its shard is rejected") {
  auto agents = LayoutBuilder().Src("t0", 0, "W", {8}).Dst("i0", 0, 0, "W", {8}).Build();
  agents[0].tensors[0].region_bytes = 10;
  CHECK(Rejection(agents) ==
        "plan rejected: 2 problems:\n"
        "- tensor W (trainer rank 0 on agent t0): region 1 has 10 bytes but the shard needs 16\n"
        "- destination W (inference replica 0 rank 0 on agent i0) has no source tensor");
}

TEST_CASE("every problem is reported at once, one per line") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "A", {4, 4})
                    .Dst("i0", 0, 0, "A", {4, 8})
                    .Dst("i0", 0, 0, "B", {4})
                    .Src("t0", 0, "l.q_proj.weight", {4, 8})
                    .Dst("i0", 0, 0, "l.qkv_proj.weight", {8, 8})
                    .Src("t0", 0, "C", {256, 256})
                    .Dst("i0", 0, 0, "C", {256, 256}, {}, DTYPE_F8_E4M3)
                    .Build();
  std::string msg = Rejection(agents);
  CHECK(msg.rfind("plan rejected: 4 problems:\n", 0) == 0);
  CHECK(msg.find("shape mismatch for A") != std::string::npos);
  CHECK(msg.find("destination B (") != std::string::npos);
  CHECK(msg.find("fusion part(s) missing: l.k_proj.weight, l.v_proj.weight") != std::string::npos);
  CHECK(msg.find("has no scale tensor C_scale_inv") != std::string::npos);
}

TEST_CASE("two agents with the same name are rejected") {
  auto agents = LayoutBuilder().Src("t0", 0, "A", {4}).Dst("i0", 0, 0, "A", {4}).Build();
  agents[1].name = "t0";
  CHECK(Rejection(agents) == "plan rejected: 1 problem:\n- agent name t0 appears more than once");
}

TEST_CASE("two sources renamed onto one destination name are rejected") {
  PlanOptions options;
  options.renames = {{R"((a|b)\.W)", "W"}};
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "a.W", {4})
                    .Src("t0", 0, "b.W", {4})
                    .Dst("i0", 0, 0, "W", {4})
                    .Build();
  CHECK(Rejection(agents, options) ==
        "plan rejected: 1 problem:\n- sources a.W and b.W both map to destination name W");
}

TEST_CASE("an invalid rename pattern is rejected") {
  PlanOptions options;
  options.renames = {{"(unclosed", "x"}};
  auto agents = LayoutBuilder().Src("t0", 0, "A", {4}).Dst("i0", 0, 0, "A", {4}).Build();
  CHECK(Rejection(agents, options) ==
        "plan rejected: 1 problem:\n- rename rule (unclosed: invalid regular expression");
}

TEST_CASE("trainer replicas that shard a tensor differently are rejected (documented limit)") {
  auto agents = LayoutBuilder()
                    .Src("tA", 0, "W", {8, 4}, {{0, 4}, {0, 4}}, DTYPE_BF16, 0)
                    .Src("tA", 1, "W", {8, 4}, {{4, 4}, {0, 4}}, DTYPE_BF16, 0)
                    .Src("tB", 2, "W", {8, 4}, {{0, 6}, {0, 4}}, DTYPE_BF16, 1)
                    .Src("tB", 3, "W", {8, 4}, {{6, 2}, {0, 4}}, DTYPE_BF16, 1)
                    .Dst("i0", 0, 0, "W", {8, 4})
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- shards of W overlap among the trainers: trainer rank 0 on agent tA holds [0:4, 0:4] "
        "and trainer replica 1 rank 2 on agent tB holds [0:6, 0:4]");
}

TEST_CASE(
    "problems come in agent order, then name order of first appearance, on any thread count") {
  // Interned in the opposite order of their first appearance below: the plan numbers names by
  // where the layouts first hold them, never by interning order.
  (void)TensorName("order.b");
  (void)TensorName("order.a");
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "order.a", {8, 4}, {{0, 4}, {0, 4}})
                    .Src("t0", 0, "order.b", {8, 4}, {{0, 4}, {0, 4}})
                    .Src("t0", 0, "order.d", {8}, {{6, 4}})
                    .Src("t1", 1, "order.c", {4, 0})
                    .Src("t1", 1, "order.b", {8, 5}, {{4, 4}, {0, 5}})
                    .Src("t1", 1, "order.a", {8, 5}, {{4, 4}, {0, 5}})
                    .Dst("i0", 0, 0, "order.a", {8, 4})
                    .Dst("i0", 0, 0, "order.b", {8, 4})
                    .Build();
  for (int threads : {1, 2, 4}) {
    INFO("threads " << threads);
    PlanOptions options;
    options.threads = threads;
    CHECK(Rejection(agents, options) ==
          "plan rejected: 4 problems:\n"
          "- tensor order.d (trainer rank 0 on agent t0): shard [6:10] lies outside the global "
          "shape [8]\n"
          "- tensor order.c (trainer rank 1 on agent t1): shape [4, 0] has an empty dimension\n"
          "- tensor order.a is registered inconsistently: bf16 [8, 4] on trainer rank 0 on agent "
          "t0 but bf16 [8, 5] on trainer rank 1 on agent t1\n"
          "- tensor order.b is registered inconsistently: bf16 [8, 4] on trainer rank 0 on agent "
          "t0 but bf16 [8, 5] on trainer rank 1 on agent t1");
  }
}
