// The controller cannot be wedged (issue 14, class 4) with real processes: a Plan for a world
// that never comes, with a huge wait_ms, is bounded by the configured plan_wait_ms, does not
// block steps of the current plan while it waits, and is dropped when its caller cancels; an
// absurd world size is refused at once; no more than 64 Plans wait, also while one is being
// made (issue 31).
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "tests/support/cluster.h"
#include "tests/support/grpc_call.h"
#include "tests/support/one_tensor.h"
#include "weightbeam/v1/controller.grpc.pb.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;
using wb::testing::Process;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("a waiting Plan neither blocks steps nor outlives its bound or caller", "[security]") {
  wb::testing::ClusterOptions options;
  options.extra_controller_yaml = "plan_wait_ms: 3000\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  auto sides = wb::testing::OneTensorSides::Open(cluster);
  auto ctl = ControllerClient::Connect(cluster.controller_address());
  REQUIRE(ctl.ok());
  wb::testing::PlanOneToOne(&*ctl);
  auto stub = v1::Controller::NewStub(
      grpc::CreateChannel(cluster.controller_address(), grpc::InsecureChannelCredentials()));

  // A world of 8 trainers never comes; the caller asks to wait an hour.
  v1::PlanRequest never;
  never.mutable_world()->set_trainer_ranks(8);
  never.mutable_world()->set_inference_replicas(1);
  never.mutable_world()->set_inference_ranks_per_replica(1);
  never.set_wait_ms(3600 * 1000);

  SECTION("the wait is capped by plan_wait_ms and steps go on meanwhile") {
    const auto t0 = Clock::now();
    auto waiting = std::async(std::launch::async, [&] {
      v1::PlanResponse resp;
      return wb::testing::CallWithin(std::chrono::seconds(30), stub.get(),
                                     &v1::Controller::Stub::Plan, never, &resp);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    // The old controller held its plan lock for the whole wait: "another step or plan is in
    // progress".
    sides.Fill(0x42);
    auto step = ctl->Step(1, std::chrono::seconds(10));
    INFO((step.ok() ? "" : std::string(step.status().message())));
    CHECK(step.ok());
    CHECK(sides.Same());
    grpc::Status st = waiting.get();
    INFO(st.error_message());
    CHECK(st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    CHECK_THAT(st.error_message(), Catch::Contains("after waiting 3000 ms"));
    CHECK(Since(t0) < 10);
  }

  SECTION("a cancelled Plan is dropped") {
    grpc::ClientContext ctx;
    v1::PlanResponse resp;
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ctx.TryCancel();
    });
    grpc::Status st = stub->Plan(&ctx, never, &resp);
    canceller.join();
    CHECK(st.error_code() == grpc::StatusCode::CANCELLED);
    // The controller lets go of it well before plan_wait_ms.
    CHECK(wb::testing::WaitUntil(
        [&] {
          return cluster.Log("controller").find("Plan was dropped: its caller went away") !=
                 std::string::npos;
        },
        std::chrono::milliseconds(2000)));
  }

  SECTION("an absurd world is refused at once") {
    v1::PlanRequest huge;
    huge.mutable_world()->set_trainer_ranks(2000000000);
    huge.mutable_world()->set_inference_replicas(1);
    huge.mutable_world()->set_inference_ranks_per_replica(1);
    huge.set_wait_ms(3600 * 1000);
    const auto t0 = Clock::now();
    v1::PlanResponse resp;
    grpc::Status st = wb::testing::CallWithin(std::chrono::seconds(30), stub.get(),
                                              &v1::Controller::Stub::Plan, huge, &resp);
    wb::testing::CheckRefused(st, grpc::StatusCode::INVALID_ARGUMENT, "beyond the limit");
    CHECK(Since(t0) < 1.5);
  }
}

TEST_CASE("the cap on waiting Plans holds while a plan is being made", "[security]") {
  wb::testing::ClusterOptions options;
  // The frozen agent below must not be declared lost while the plan waits on it.
  options.heartbeat_timeout_ms = 60000;
  options.extra_controller_yaml = "plan_wait_ms: 3000\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  auto sides = wb::testing::OneTensorSides::Open(cluster);
  auto ctl = ControllerClient::Connect(cluster.controller_address());
  REQUIRE(ctl.ok());
  wb::testing::PlanOneToOne(&*ctl);
  auto stub = v1::Controller::NewStub(
      grpc::CreateChannel(cluster.controller_address(), grpc::InsecureChannelCredentials()));

  // Plans for a world that never comes: each waits (or is refused at once when 64 already do).
  v1::PlanRequest never;
  never.mutable_world()->set_trainer_ranks(8);
  never.mutable_world()->set_inference_replicas(1);
  never.mutable_world()->set_inference_ranks_per_replica(1);
  std::vector<std::future<grpc::Status>> calls;
  auto submit = [&](int n) {
    for (int i = 0; i < n; ++i) {
      calls.push_back(std::async(std::launch::async, [&] {
        v1::PlanResponse resp;
        return wb::testing::CallWithin(std::chrono::seconds(30), stub.get(),
                                       &v1::Controller::Stub::Plan, never, &resp);
      }));
    }
  };
  submit(40);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  // A Plan whose world is complete: the scheduler's next pass takes it with the 40 waiting ones
  // and stays in PlanNow while the inference agent is frozen (its Describe waits).
  Process* frozen = cluster.agent("inference-node");
  frozen->Signal(SIGSTOP);
  struct Thaw {
    Process* p;
    ~Thaw() { p->Signal(SIGCONT); }
  } thaw{frozen};
  v1::PlanRequest ready;
  *ready.mutable_world() = wb::testing::World(1, 1, 1);
  auto planning = std::async(std::launch::async, [&] {
    v1::PlanResponse resp;
    return wb::testing::CallWithin(std::chrono::seconds(30), stub.get(),
                                   &v1::Controller::Stub::Plan, ready, &resp);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));

  // Meanwhile 100 more: 41 are held by the pass, so only 23 may wait. The old scheduler's
  // queue looked empty during the pass: 64 more waited (104 in all).
  submit(100);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  frozen->Signal(SIGCONT);
  int refused = 0, waited = 0;
  std::string other;
  for (auto& c : calls) {
    grpc::Status st = c.get();
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
    } else if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      ++waited;
    } else {
      other = st.error_message();
    }
  }
  INFO("refused " << refused << ", waited " << waited << ", other: " << other);
  CHECK(waited + 1 <= 64);  // the Plan being made is one of the 64
  CHECK(refused == 140 - waited);
  grpc::Status st = planning.get();
  INFO(st.error_message());
  CHECK(st.ok());
}
