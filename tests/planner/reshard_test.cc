// Resharding geometry: the exact runs for dim-0, dim-1 and 3-D boxes.
#include "common/planner/reshard.h"

#include <catch2/catch.hpp>

using wb::planner::Box;
using wb::planner::BoxRuns;
using wb::planner::Run;

namespace {

Box MakeBox(std::vector<int64_t> start, std::vector<int64_t> size) {
  Box b;
  b.ndim = static_cast<int>(start.size());
  for (int d = 0; d < b.ndim; ++d) b.start[d] = start[d], b.size[d] = size[d];
  return b;
}

}  // namespace

TEST_CASE("a dim-0 slice of a row-major tensor is one contiguous run") {
  // Source holds rows [0, 8) of [16, 10]; destination rows [4, 12); overlap rows [4, 8).
  std::vector<Run> runs;
  BoxRuns(MakeBox({4, 0}, {4, 10}), MakeBox({0, 0}, {8, 10}), MakeBox({4, 0}, {8, 10}), &runs);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].rows == 1);
  CHECK(runs[0].row_elems == 40);
  CHECK(runs[0].src_offset == 40);
  CHECK(runs[0].dst_offset == 0);
}

TEST_CASE("a dim-1 slice gives strided rows") {
  // Source holds all of [4, 10]; destination holds columns [6, 10).
  std::vector<Run> runs;
  BoxRuns(MakeBox({0, 6}, {4, 4}), MakeBox({0, 0}, {4, 10}), MakeBox({0, 6}, {4, 4}), &runs);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].rows == 4);
  CHECK(runs[0].row_elems == 4);
  CHECK(runs[0].src_offset == 6);
  CHECK(runs[0].src_stride == 10);
  CHECK(runs[0].dst_offset == 0);
  CHECK(runs[0].dst_stride == 4);
}

TEST_CASE("a 3-D box cut on the middle dimension folds full trailing dims into each row") {
  // [2, 6, 5]: source all, destination holds [:, 2:4, :] -> rows of 2*5 contiguous elements,
  // one run per index of dim 0.
  std::vector<Run> runs;
  BoxRuns(MakeBox({0, 2, 0}, {2, 2, 5}), MakeBox({0, 0, 0}, {2, 6, 5}),
          MakeBox({0, 2, 0}, {2, 2, 5}), &runs);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].rows == 2);
  CHECK(runs[0].row_elems == 10);
  CHECK(runs[0].src_offset == 10);
  CHECK(runs[0].src_stride == 30);
  CHECK(runs[0].dst_stride == 10);
}

TEST_CASE("a 3-D box cut on the last two dimensions gives one run per outer index") {
  std::vector<Run> runs;
  BoxRuns(MakeBox({0, 1, 1}, {3, 2, 2}), MakeBox({0, 0, 0}, {3, 4, 4}),
          MakeBox({0, 1, 1}, {3, 2, 2}), &runs);
  REQUIRE(runs.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(runs[i].rows == 2);
    CHECK(runs[i].row_elems == 2);
    CHECK(runs[i].src_offset == static_cast<uint64_t>(i * 16 + 4 + 1));
    CHECK(runs[i].src_stride == 4);
    CHECK(runs[i].dst_offset == static_cast<uint64_t>(i * 4));
    CHECK(runs[i].dst_stride == 2);
  }
}
