// FP8 block destinations: 2-D ops covering whole 128x128 blocks with their scale placement,
// and the clear errors when source or destination shards split a block.
#include <catch2/catch.hpp>

#include "common/planner/plan.h"
#include "tests/planner/layout_builder.h"
#include "tests/planner/plan_checks.h"

using namespace wb::planner;
using namespace wb::planner::testing;

TEST_CASE("FP8: each trainer's 128-row slice becomes one op with its row of block scales") {
  // W [256, 384] bf16, trainers hold rows [0,128) and [128,256); destination FP8 + [2, 3] scales.
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {256, 384}, {{0, 128}, {0, 384}})
                    .Src("t1", 1, "W", {256, 384}, {{128, 128}, {0, 384}})
                    .Fp8Dst("i0", 0, 0, "W", {256, 384})
                    .Build();
  const Plan plan = MustPlanFused(agents);
  auto ops = AllOps(agents, plan);
  REQUIRE(ops.size() == 2);
  for (int k = 0; k < 2; ++k) {
    const PlannedOp& op = ops[k].second;
    CHECK(op.GetTransform() == weightbeam::v1::TRANSFORM_FP8_BLOCK);
    CHECK(op.SrcDType() == DTYPE_BF16);
    CHECK(op.DstDType() == DTYPE_F8_E4M3);
    CHECK(op.rows == 128);
    CHECK(op.row_elems == 384);
    CHECK(op.src_offset == 0);
    CHECK(op.src_stride == 384 * 2);
    CHECK(op.dst_offset == static_cast<uint64_t>(k * 128 * 384));
    CHECK(op.dst_stride == 384);
    CHECK(agents[op.dst_agent].tensors[op.scale_tensor].name == "W_scale_inv");
    CHECK(op.scale_offset == static_cast<uint64_t>(k * 3 * 4));
    CHECK(op.scale_stride == 3 * 4);
    CHECK(op.DstBytes() == 128 * 384 + 3 * 4);
  }
  CHECK(plan.stats.total_bytes == 256 * 384 + 2 * 3 * 4);
}

TEST_CASE("FP8 with a row-parallel destination: strided rows, scales at the shard's blocks") {
  // W [256, 384]; TP rank 0 holds columns [0,128), rank 1 [128,384), scales sharded alike.
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {256, 384}, {{0, 128}, {0, 384}})
                    .Src("t1", 1, "W", {256, 384}, {{128, 128}, {0, 384}})
                    .Fp8Dst("i0", 0, 0, "W", {256, 384}, {{0, 256}, {0, 128}}, 0)
                    .Fp8Dst("i0", 0, 1, "W", {256, 384}, {{0, 256}, {128, 256}}, 1)
                    .Build();
  const Plan plan = MustPlanFused(agents);
  int checked = 0;
  for (const auto& [agent, op] : AllOps(agents, plan)) {
    if (agents[op.dst_agent].tensors[op.dst_tensor].owner.rank != 1) continue;
    const int k = agent == "t0" ? 0 : 1;
    CHECK(op.rows == 128);
    CHECK(op.row_elems == 256);
    CHECK(op.src_offset == 128 * 2);
    CHECK(op.src_stride == 384 * 2);
    CHECK(op.dst_offset == static_cast<uint64_t>(k * 128 * 256));
    CHECK(op.dst_stride == 256);
    CHECK(op.scale_offset == static_cast<uint64_t>(k * 2 * 4));
    CHECK(op.scale_stride == 2 * 4);
    ++checked;
  }
  CHECK(checked == 2);
}

TEST_CASE("FP8: source shards that split a 128-row block are rejected, naming the boundary") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {256, 256}, {{0, 100}, {0, 256}})
                    .Src("t1", 1, "W", {256, 256}, {{100, 156}, {0, 256}})
                    .Fp8Dst("i0", 0, 0, "W", {256, 256})
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- FP8 destination W (inference replica 0 rank 0 on agent i0): source W held by trainer "
        "rank 0 on agent t0 as [0:100, 0:256] gives rows [0, 100) of the destination, splitting "
        "the 128-row block at row 100; FP8 block scaling needs each 128x128 block from one "
        "source, so source shards must be cut at multiples of 128");
}

TEST_CASE("FP8: destination shards must be cut at multiples of 128") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {256, 256})
                    .Fp8Dst("i0", 0, 0, "W", {256, 256}, {{0, 64}, {0, 256}}, 0)
                    .Fp8Dst("i0", 0, 1, "W", {256, 256}, {{64, 192}, {0, 256}}, 1)
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 2 problems:\n"
        "- shards of W_scale_inv overlap among inference replica 0: inference replica 0 rank 0 "
        "on agent i0 holds [0:1, 0:2] and inference replica 0 rank 1 on agent i0 holds [0:2, "
        "0:2]\n"
        "- FP8 destination W: inference replica 0 rank 0 on agent i0 holds [0:64, 0:256] whose "
        "row boundary 64 splits a 128x128 scale block; FP8 destination shards must be cut at "
        "multiples of 128");
}

TEST_CASE("FP8: a scale shard that does not match its weight shard's blocks is rejected") {
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "W", {256, 256})
                    .Dst("i0", 0, 0, "W", {256, 256}, {{0, 128}, {0, 256}}, DTYPE_F8_E4M3, 0)
                    .Dst("i0", 0, 0, "W_scale_inv", {2, 2}, {{1, 1}, {0, 2}}, DTYPE_F32, 0)
                    .Dst("i0", 0, 1, "W", {256, 256}, {{128, 128}, {0, 256}}, DTYPE_F8_E4M3, 1)
                    .Dst("i0", 0, 1, "W_scale_inv", {2, 2}, {{0, 1}, {0, 2}}, DTYPE_F32, 1)
                    .Build();
  CHECK(Rejection(agents) ==
        "plan rejected: 1 problem:\n"
        "- FP8 scale tensor W_scale_inv on inference replica 0 rank 0 on agent i0 holds blocks "
        "[1:2, 0:2] but its weight shard [0:128, 0:256] needs blocks [0:1, 0:2]");
}

TEST_CASE("FP8 fused destination: a part boundary inside a block is rejected") {
  // q has 100 rows: the k part would start inside the first 128-row block.
  auto agents = LayoutBuilder()
                    .Src("t0", 0, "l.q_proj.weight", {100, 128})
                    .Src("t0", 0, "l.k_proj.weight", {78, 128})
                    .Src("t0", 0, "l.v_proj.weight", {78, 128})
                    .Fp8Dst("i0", 0, 0, "l.qkv_proj.weight", {256, 128})
                    .Build();
  auto plan = PlanFused(agents);
  REQUIRE_FALSE(plan.ok());
  CHECK(std::string(plan.status().message())
            .find("source l.q_proj.weight held by trainer rank 0 on agent t0 as [0:100, 0:128] "
                  "gives rows [0, 100) of the destination, splitting the 128-row block at row "
                  "100") != std::string::npos);
}
