// Learned link rates (CostModel::agent_rate_scale): two data-parallel trainers each hold all of
// W (16 row blocks of 128 KiB) and send to one inference agent over 1 GB/s rails. The expected
// shares and times are worked out here from the layout, not read from the planner's code.
#include <catch2/catch.hpp>

#include "common/planner/plan.h"
#include "tests/planner/layout_builder.h"

using namespace wb::planner;
using namespace wb::planner::testing;

namespace {

constexpr double kMiB = 1 << 20;

// The receiver holds W as 16 shards of 64 rows (one op each); both trainers hold all of it.
absl::StatusOr<Plan> TwoCopies(const std::map<std::string, double>& scale) {
  LayoutBuilder b;
  b.Src("t0", 0, "W", {1024, 1024});
  b.Src("t1", 0, "W", {1024, 1024}, {}, DTYPE_BF16, /*replica=*/1);
  for (int k = 0; k < 16; ++k) {
    b.Dst("i0", 0, k, "W", {1024, 1024}, {{64 * k, 64}, {0, 1024}});
  }
  for (const char* agent : {"t0", "t1", "i0"}) b.Nics(agent, 1, 1.0);
  PlanOptions options;
  options.cost.op_overhead_us = 0;
  options.cost.agent_rate_scale = scale;
  return BuildPlan(b.Build(), options);
}

uint64_t SentBy(const Plan& plan, int agent_index) { return plan.stats.send_bytes[agent_index]; }

}  // namespace

TEST_CASE("without measurements both copies send half, priced at the rated speed") {
  auto plan = TwoCopies({});
  REQUIRE(plan.ok());
  // Statistics are by input agent: t0, t1, i0.
  CHECK(SentBy(*plan, 0) == 1 * kMiB);
  CHECK(SentBy(*plan, 1) == 1 * kMiB);
  // The receiver's one rail takes all 2 MiB at 1 GB/s.
  CHECK(plan->stats.predicted_step_seconds == Approx(2 * kMiB / 1e9));
}

TEST_CASE("a link measured at a quarter of its rate gets a fifth of the work, priced slow") {
  auto plan = TwoCopies({{"t0", 0.25}});
  REQUIRE(plan.ok());
  // Balanced in time: t0 at 0.25 GB/s and t1 at 1 GB/s finish together when t0 sends 1/5.
  // Greedy over 16 ops of 128 KiB, each to the copy whose load in time is lower (ties to t0):
  // t0 takes ops 1, 6, 11 and 16 (each counting 4x), t1 the other 12.
  CHECK(SentBy(*plan, 0) == 4 * 128 * 1024);
  CHECK(SentBy(*plan, 1) == 12 * 128 * 1024);
  // t0's rail: 512 KiB at 0.25 GB/s = 2.10 ms; t1's: 1.5 MiB at 1 GB/s = 1.57 ms; the
  // receiver's 2 MiB at 1 GB/s = 2.10 ms.
  CHECK(plan->stats.predicted_step_seconds == Approx(2 * kMiB / 1e9));
  // A quarter of the rate for both copies: every rail at 0.25 GB/s; the receiver is not slow.
  auto both = TwoCopies({{"t0", 0.25}, {"t1", 0.25}});
  REQUIRE(both.ok());
  CHECK(SentBy(*both, 0) == 1 * kMiB);
  CHECK(both->stats.predicted_step_seconds == Approx(1 * kMiB / 0.25e9));
}

TEST_CASE("a scale of 1, above 1 or not positive leaves the plan as rated") {
  auto plain = TwoCopies({});
  REQUIRE(plain.ok());
  for (double f : {1.0, 2.0, 0.0, -1.0}) {
    auto plan = TwoCopies({{"t0", f}});
    REQUIRE(plan.ok());
    CHECK(plan->hash == plain->hash);
  }
}
