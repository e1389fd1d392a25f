// wbctl's step report: the "who waited" line shows the trainer's hold and each replica's pause.
#include "client/report_format.h"

#include <catch2/catch.hpp>

namespace v1 = weightbeam::v1;

TEST_CASE("a step report says how long the trainer was held and each replica paused") {
  v1::StepResult r;
  r.set_version(7);
  r.set_ok(true);
  r.set_seconds(1.5);
  r.set_trainer_stall_seconds(0.012);
  r.set_capture("captured");
  auto* a = r.add_replica_pauses();
  a->set_replica(0);
  a->set_seconds(0.004);
  a->set_staged(true);
  auto* b = r.add_replica_pauses();
  b->set_replica(1);
  b->set_seconds(1.25);
  r.set_inference_pause_seconds(1.25);
  const std::string out = wb::client::FormatStep(r);
  CHECK_THAT(out, Catch::Contains("trainer held 0.012 s (captured)"));
  CHECK_THAT(out, Catch::Contains("inference paused 1.250 s"));
  CHECK_THAT(out, Catch::Contains("replica 0: 0.004 s swap"));
  CHECK_THAT(out, Catch::Contains("replica 1: 1.250 s in place"));

  v1::StepResult quiet;  // an old controller's result: no line at all
  quiet.set_version(8);
  quiet.set_ok(true);
  CHECK_THAT(wb::client::FormatStep(quiet), !Catch::Contains("trainer held"));
}
