// The compact layout entry's parts: SmallVec (inline, then heap beyond its capacity) and
// TensorName (interned: equal text, equal id; Find never inserts; safe across threads), and a
// plan of 3-D entries, whose shape and shard are beyond the inline capacity (on the heap).
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/planner/layout.h"
#include "tests/planner/layout_builder.h"
#include "tests/planner/plan_checks.h"

using wb::planner::DimSlice;
using wb::planner::SmallVec;
using wb::planner::TensorName;

TEST_CASE("SmallVec matches std::vector inline and spilled to the heap") {
  std::vector<int64_t> ref;
  SmallVec<int64_t, 2> v;
  for (int64_t i = 0; i < 9; ++i) {
    v.push_back(i * 7 - 3);
    ref.push_back(i * 7 - 3);
    REQUIRE(v.size() == ref.size());
    REQUIRE(std::vector<int64_t>(v) == ref);
    REQUIRE(v.back() == ref.back());
  }
  SmallVec<int64_t, 2> copy = v;  // heap copy is independent
  copy[0] = 100;
  REQUIRE(v[0] == -3);
  SmallVec<int64_t, 2> moved = std::move(copy);
  REQUIRE(moved[0] == 100);
  REQUIRE(moved.size() == 9);
  REQUIRE(copy.empty());  // NOLINT: moved-from is empty by contract
  SmallVec<int64_t, 2> small = {4, 5};
  SmallVec<int64_t, 2> small_moved = std::move(small);
  REQUIRE(std::vector<int64_t>(small_moved) == std::vector<int64_t>{4, 5});
  small_moved = v;  // inline -> heap by assignment
  REQUIRE(small_moved == v);
  small_moved = SmallVec<int64_t, 2>{1};
  REQUIRE(small_moved.size() == 1);
  REQUIRE(small_moved[0] == 1);
  REQUIRE(SmallVec<int64_t, 2>{1, 2} < SmallVec<int64_t, 2>{1, 3});
  REQUIRE(SmallVec<int64_t, 2>{1, 2} != SmallVec<int64_t, 2>{1, 2, 0});
  SmallVec<DimSlice, 2> shard = std::vector<DimSlice>{{0, 1}, {2, 3}, {4, 5}};
  REQUIRE(shard.size() == 3);
  REQUIRE(shard[2].start == 4);
  REQUIRE(shard[2].size == 5);
}

TEST_CASE("TensorName interns: equal text, equal id; Find does not insert") {
  const std::string text = "model.layers.7.mlp.experts.3.up_proj.weight";
  TensorName a(text);
  TensorName b(std::string("model.layers.7.mlp.") + "experts.3.up_proj.weight");
  REQUIRE(a == b);
  REQUIRE(a.id() == b.id());
  REQUIRE(a.str() == text);
  REQUIRE(TensorName::Find(text) == a);
  REQUIRE(a.id() < TensorName::Count());
  REQUIRE(TensorName("model.layers.7.mlp.experts.3.gate_proj.weight") != a);
  const uint32_t count = TensorName::Count();
  REQUIRE_FALSE(TensorName::Find("compact_entry_test: a name nobody interned"));
  REQUIRE_FALSE(TensorName::Find("compact_entry_test: a name nobody interned"));
  REQUIRE(TensorName::Count() == count);
  // Ids are dense: the next new name takes the next id.
  REQUIRE(TensorName("compact_entry_test: a new name").id() == count);
  REQUIRE(TensorName().empty());
  REQUIRE(TensorName() == TensorName(""));
  // Ordered by text, not by id (interned later, sorts first).
  const TensorName zz("compact_entry_test: zz"), aa("compact_entry_test: aa");
  REQUIRE(aa < zz);
  REQUIRE_FALSE(zz < aa);
}

TEST_CASE("TensorName interning from several threads gives one id per name") {
  constexpr int kThreads = 4, kNames = 2000;
  std::vector<std::vector<uint32_t>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kNames; ++i) {
        ids[t].push_back(TensorName("compact_entry_test.thread." + std::to_string(i)).id());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 1; t < kThreads; ++t) REQUIRE(ids[t] == ids[0]);
  for (int i = 0; i < kNames; ++i) {
    const auto found = TensorName::Find("compact_entry_test.thread." + std::to_string(i));
    REQUIRE(found);
    REQUIRE(found->id() == ids[0][i]);
    REQUIRE(found->str() == "compact_entry_test.thread." + std::to_string(i));
    if (i > 0) REQUIRE(ids[0][i] != ids[0][i - 1]);
  }
}

TEST_CASE("3-D entries (shape and shard on the heap) are resharded element for element") {
  // [4, 6, 8] bf16: trainers split dim 0 in halves, the two inference ranks split dim 1.
  using wb::planner::testing::LayoutBuilder;
  LayoutBuilder b;
  b.Src("t0", 0, "w", {4, 6, 8}, {{0, 2}, {0, 6}, {0, 8}});
  b.Src("t1", 1, "w", {4, 6, 8}, {{2, 2}, {0, 6}, {0, 8}});
  b.Dst("i0", 0, 0, "w", {4, 6, 8}, {{0, 4}, {0, 3}, {0, 8}});
  b.Dst("i0", 0, 1, "w", {4, 6, 8}, {{0, 4}, {3, 3}, {0, 8}});
  const std::vector<wb::planner::AgentLayout> agents = b.Build();
  REQUIRE(agents[0].tensors[0].shape.size() == 3);
  const wb::planner::Plan plan = wb::planner::testing::MustPlan(agents);
  REQUIRE(plan.stats.total_bytes == 4 * 6 * 8 * 2);
  // Each destination gets its 4 x 3 x 8 elements: from each source half (agents t0, t1), 2
  // rows of 3 x 8 contiguous elements starting at column 0 or 3 of the source's rows (strides
  // and offsets in bytes, bf16).
  std::vector<uint64_t> elems(2, 0);
  for (size_t a = 0; a < agents.size(); ++a) {
    for (const wb::planner::PlannedOp& op :
         wb::planner::ExecutedOps(plan, static_cast<int32_t>(a))) {
      elems[op.dst_tensor] += op.rows * op.row_elems;
      const uint64_t col = op.dst_tensor == 0 ? 0 : 3;
      REQUIRE(op.rows == 2);
      REQUIRE(op.row_elems == 3 * 8);
      REQUIRE(op.src_offset == col * 8 * 2);
      REQUIRE(op.src_stride == 6 * 8 * 2);
      REQUIRE(op.dst_offset == static_cast<uint64_t>(op.src_agent) * 2 * 3 * 8 * 2);
      REQUIRE(op.dst_stride == 3 * 8 * 2);
    }
  }
  REQUIRE(elems == std::vector<uint64_t>{4 * 3 * 8, 4 * 3 * 8});
}
