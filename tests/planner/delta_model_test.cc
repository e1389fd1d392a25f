// The delta step model (common/planner/delta_model.h) on a real plan: two trainers each send a
// 1 MiB BF16 tensor to one inference agent over 1 GB/s rails. The expected figures are worked
// out here by hand from the layout, not read back from the plan's statistics.
#include "common/planner/delta_model.h"

#include <catch2/catch.hpp>

#include "tests/planner/layout_builder.h"

using namespace wb::planner;
using namespace wb::planner::testing;

namespace {

constexpr double kMiB = 1 << 20;

absl::StatusOr<Plan> TwoToOne() {
  LayoutBuilder b;
  b.Src("t0", 0, "W", {1024, 1024}, {{0, 512}, {0, 1024}});  // 1 MiB of BF16 each
  b.Src("t1", 1, "W", {1024, 1024}, {{512, 512}, {0, 1024}});
  b.Dst("i0", 0, 0, "W", {1024, 1024});
  for (const char* agent : {"t0", "t1", "i0"}) b.Nics(agent, 1, 1.0);  // one 1 GB/s rail each
  PlanOptions options;
  options.cost.op_overhead_us = 0;  // the link term alone: bytes / rate
  return BuildPlan(b.Build(), options);
}

}  // namespace

TEST_CASE("a delta step: encode every dense byte, send the packed fraction, apply it") {
  auto plan = TwoToOne();
  REQUIRE(plan.ok());
  DeltaModel m;
  m.changed_fraction = 0.01;
  m.element_bytes = 2;
  m.index_bytes = 2;
  m.encode_gbps = 0.5;  // 1 MiB per sender: 2.097 ms
  m.apply_gbps = 0.1;   // the receiver applies 2 % of 2 MiB
  const DeltaPrediction p = PredictDeltaStep(plan->stats, m);
  // 1 % of the elements, each 2 bytes of value and 2 of gap: 2 % of the dense bytes.
  CHECK(p.packed_fraction == Approx(0.02));
  CHECK(p.encode_seconds == Approx(kMiB / 0.5e9));
  // The receiver's one rail takes both MiB at 1 GB/s: the dense link limit is 2 MiB / 1e9.
  CHECK(p.send_seconds == Approx(2 * kMiB / 1e9 * 0.02));
  CHECK(p.apply_seconds == Approx(2 * kMiB * 0.02 / 0.1e9));
  CHECK(p.seconds == Approx(kMiB / 0.5e9 + 2 * kMiB * 0.02 / 0.1e9));
  // Nothing changed: only the compare is left. Everything changed: no cheaper than dense bytes.
  m.changed_fraction = 0;
  CHECK(PredictDeltaStep(plan->stats, m).seconds == Approx(kMiB / 0.5e9));
  m.changed_fraction = 1;
  m.encode_gbps = 1e6;
  const DeltaPrediction all = PredictDeltaStep(plan->stats, m);
  CHECK(all.packed_fraction == 1.0);
  CHECK(all.send_seconds == Approx(2 * kMiB / 1e9));
}

TEST_CASE("a delta step keeps the dense prediction's per-op part") {
  LayoutBuilder b;
  b.Src("t0", 0, "W", {1024, 1024});
  b.Dst("i0", 0, 0, "W", {1024, 1024});
  PlanOptions options;
  options.cost.op_overhead_us = 1000;  // 1 ms per op, priced in bytes at the rail's rate
  auto plan = BuildPlan(b.Build(), options);
  REQUIRE(plan.ok());
  const double per_op = plan->stats.predicted_step_seconds - plan->stats.link_limit_seconds;
  REQUIRE(per_op > 0);
  DeltaModel m;
  m.changed_fraction = 0;
  CHECK(PredictDeltaStep(plan->stats, m).send_seconds == Approx(per_op));
}
