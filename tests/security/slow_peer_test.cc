// Slow peers fail steps, never processes (issue 14, class 7) with real processes: a receiver
// that stops draining (SIGSTOP) makes the step fail at its deadline naming that receiver; the
// sending agent neither aborts nor holds the step hostage to the transport's write timeout, and
// once the receiver runs again the next step commits every byte.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>

#include "client/weightbeam/controller_client.h"
#include "tests/support/cluster.h"
#include "tests/support/one_tensor.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace v1 = weightbeam::v1;
using wb::client::ControllerClient;
using wb::testing::Cluster;

TEST_CASE("a stalled receiver fails the step naming it; the sender lives", "[security]") {
  wb::testing::ClusterOptions options;
  options.heartbeat_timeout_ms = 60000;  // the frozen receiver must stay in the world
  // The transport's own stall limit is far beyond the step deadline: the step must not wait
  // for it.
  options.extra_agent_yaml = "executor:\n  write_timeout_ms: 30000\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  wb::testing::OneTensorShape shape;
  shape.rows = 2048;  // 4 MiB of bf16
  shape.cols = 1024;
  auto sides = wb::testing::OneTensorSides::Open(cluster, shape);
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  const v1::PlanSummary plan = wb::testing::PlanOneToOne(&ctl, std::chrono::seconds(30));
  sides.Fill(0x11);
  auto first = ctl.Step(1, std::chrono::seconds(20));
  INFO((first.ok() ? "" : std::string(first.status().message())));
  REQUIRE(first.ok());

  // Between a step's Begin and its writes the receiver stops draining: the test asks the
  // sending agent to execute directly (as the controller does after Begin) while the receiver
  // is frozen.
  cluster.KillAgent("inference-node", SIGSTOP);
  sides.Fill(0x22);
  auto agent = v1::Agent::NewStub(grpc::CreateChannel(cluster.agent_address("trainer-node"),
                                                      grpc::InsecureChannelCredentials()));
  v1::ExecuteRequest req;
  req.set_version(2);
  req.set_plan_id(plan.plan_id());
  req.set_timeout_ms(2000);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::ExecuteResponse resp;
  const auto t0 = std::chrono::steady_clock::now();
  grpc::Status st = agent->Execute(&ctx, req, &resp);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(st.error_message() << " / " << resp.report().error() << " after " << took << " s");
  REQUIRE(st.ok());
  CHECK_FALSE(resp.report().ok());
  // The step is given up at its deadline and names the peer that held it (the old executor
  // waited for the transport's 30 s write timeout, then aborted the agent if still stuck).
  CHECK_THAT(resp.report().error(),
             Catch::Contains("slow peer") && Catch::Contains("'inference-node'"));
  CHECK(took < 10);
  CHECK(cluster.agent("trainer-node")->running());

  cluster.KillAgent("inference-node", SIGCONT);
  sides.Fill(0x33);
  // The next step commits every byte (a retry or two while the sender reconnects is fine).
  bool committed = false;
  for (uint64_t v = 3; v < 8 && !committed; ++v) {
    auto step = ctl.Step(v, std::chrono::seconds(20));
    if (!step.ok()) UNSCOPED_INFO("step " << v << ": " << step.status().message());
    committed = step.ok();
  }
  REQUIRE(committed);
  CHECK(sides.Same());
  CHECK(cluster.agent("trainer-node")->running());
}
