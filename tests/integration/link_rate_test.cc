// The tcp rail's rate reaches the planner (issue 32, "every link rated"): agents started with
// `transports.tcp.gbps` report it in their NIC list, and the plan's predicted step time follows
// it. Real controller and agents on loopback, local transport off so tcp is the only rail.
#include <catch2/catch.hpp>

#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using wb::testing::Cluster;
using wb::testing::ClusterOptions;

namespace {

struct Rated {
  double reported_gbps = 0;  // what the trainer agent's tcp rail told the controller
  double predicted_seconds = 0;
};

Rated PlanWithTcpAt(const std::string& gbps) {
  ClusterOptions options;
  options.transports_yaml = "    gbps: " + gbps + "\n  local:\n    enabled: false\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  wb::testing::OneTensorShape shape;
  shape.rows = 4096;  // 8 MiB of BF16: the bytes, not the per-op overhead, set the prediction
  shape.cols = 1024;
  auto sides = wb::testing::OneTensorSides::Open(cluster, shape);
  auto ctl = wb::client::ControllerClient::Connect(cluster.controller_address());
  REQUIRE(ctl.ok());
  auto plan = ctl->Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(20));
  REQUIRE(plan.ok());
  Rated r;
  r.predicted_seconds = plan->predicted_step_seconds();
  auto status = ctl->Status();
  REQUIRE(status.ok());
  for (const auto& a : status->agents()) {
    if (a.info().name() != "trainer-node") continue;
    for (const auto& nic : a.info().nics()) {
      CHECK(nic.transport() == "tcp");  // local is off: tcp is the only rail
      if (nic.transport() == "tcp") r.reported_gbps = nic.gbps();
    }
  }
  return r;
}

}  // namespace

TEST_CASE("transports.tcp.gbps is what the rail reports and what the plan predicts with") {
  const Rated fast = PlanWithTcpAt("2");
  const Rated slow = PlanWithTcpAt("0.5");
  CHECK(fast.reported_gbps == Approx(2.0));
  CHECK(slow.reported_gbps == Approx(0.5));
  INFO("predicted at 2 GB/s: " << fast.predicted_seconds
                               << " s, at 0.5 GB/s: " << slow.predicted_seconds << " s");
  REQUIRE(fast.predicted_seconds > 0);
  // 8 MiB at 2 GB/s is 4.2 ms; at 0.5 GB/s four times that. The per-op overhead term is priced
  // at cost_model.nic_gbps and does not scale with the rail, so the ratio is a little under 4.
  const double ratio = slow.predicted_seconds / fast.predicted_seconds;
  CHECK(ratio > 3.5);
  CHECK(ratio <= 4.0 + 1e-9);
  CHECK(fast.predicted_seconds > 8.0 * 1024 * 1024 / 2e9);
}
