// Step fencing (issue 14, class 8) with real processes over the tcp transport: a step that
// timed out at the controller must not put a single byte into a destination once the next step
// began, and a receiver refuses writes of any step but the one it began.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/grpc_call.h"
#include "tests/support/one_tensor.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

constexpr int64_t kRows = 256, kCols = 512;

// Version v's value of element i as the bf16 the destination must hold: finite, in [0.5, 2),
// different in every version. The trainer holds it as the f32 with the same upper 16 bits
// (exactly representable in bf16, so the cast is exact whatever its rounding).
uint16_t Bf16Of(uint64_t version, uint64_t i) {
  return static_cast<uint16_t>(0x3F00 | ((i * 7 + version * 31) & 0xFF));
}

void FillSource(SharedBuffer* src, uint64_t version) {
  auto* f32 = static_cast<uint32_t*>(src->data());
  for (uint64_t i = 0; i < uint64_t(kRows * kCols); ++i) {
    f32[i] = uint32_t{Bf16Of(version, i)} << 16;
  }
}

// Every element of the destination that is not version v's; -1 when all are.
int64_t FirstWrong(const SharedBuffer& dst, uint64_t version) {
  const auto* bf16 = static_cast<const uint16_t*>(dst.data());
  for (uint64_t i = 0; i < uint64_t(kRows * kCols); ++i) {
    if (bf16[i] != Bf16Of(version, i)) return static_cast<int64_t>(i);
  }
  return -1;
}

std::unique_ptr<v1::Agent::Stub> AgentStub(const Cluster& cluster, const std::string& agent) {
  return v1::Agent::NewStub(
      grpc::CreateChannel(cluster.agent_address(agent), grpc::InsecureChannelCredentials()));
}

}  // namespace

TEST_CASE("a timed-out step's writes never land after the next step", "[security]") {
  wb::testing::ClusterOptions options;
  options.heartbeat_timeout_ms = 60000;  // the frozen receiver must stay in the world
  // The sender's write stage holds version 2's operation for 8 s (a stage that cannot be
  // interrupted), well past that step's 2 s deadline: by then the controller gave up on
  // version 2 and version 3 may be running. The op is a cast (f32 -> bf16), so the bytes it
  // would send are version 2's, prepared before the hold.
  options.agent_yaml["trainer-node"] = "executor:\n  test_hold_version: 2\n  test_hold_ms: 8000\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  auto src = SharedBuffer::Create(kRows * kCols * 4, "src");
  auto dst = SharedBuffer::Create(kRows * kCols * 2, "dst");
  REQUIRE((src.ok() && dst.ok()));
  auto trainer = LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
  auto inference =
      LocalSession::Connect(cluster.socket("inference-node"), {v1::ROLE_INFERENCE, 0, 0});
  REQUIRE((trainer.ok() && inference.ok()));
  REQUIRE(trainer->Register({"w", v1::DTYPE_F32, {kRows, kCols}, {}}, *src, 0, src->size()).ok());
  REQUIRE(
      inference->Register({"w", v1::DTYPE_BF16, {kRows, kCols}, {}}, *dst, 0, dst->size()).ok());
  auto ctl = ControllerClient::Connect(cluster.controller_address());
  REQUIRE(ctl.ok());
  wb::testing::PlanOneToOne(&*ctl);

  FillSource(&*src, 1);
  auto first = ctl->Step(1, std::chrono::seconds(20));
  INFO((first.ok() ? "" : std::string(first.status().message())));
  REQUIRE(first.ok());
  REQUIRE(FirstWrong(*dst, 1) == -1);

  // Version 2: begun on the receiver, then the receiver freezes while the sender holds the
  // batch; the step times out at the controller.
  FillSource(&*src, 2);
  const auto t2 = std::chrono::steady_clock::now();
  auto second =
      std::async(std::launch::async, [&] { return ctl->Step(2, std::chrono::milliseconds(2000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  cluster.KillAgent("inference-node", SIGSTOP);
  auto failed = second.get();
  REQUIRE_FALSE(failed.ok());
  INFO("version 2: " << failed.status().message());
  cluster.KillAgent("inference-node", SIGCONT);

  // Version 3, different data, while version 2's batch is still held on the sender.
  FillSource(&*src, 3);
  auto third = ctl->Step(3, std::chrono::seconds(30));
  INFO((third.ok() ? "" : std::string(third.status().message())));
  REQUIRE(third.ok());
  // Past the hold: whatever version 2 would still send has had its chance to land.
  std::this_thread::sleep_until(t2 + std::chrono::seconds(11));
  CHECK(cluster.agent("trainer-node")->running());
  CHECK(cluster.agent("inference-node")->running());
  // Every byte is version 3's (the reference is computed here, not read from the source).
  const int64_t wrong = FirstWrong(*dst, 3);
  INFO("first wrong element " << wrong << ": 0x" << std::hex
                              << (wrong < 0 ? 0 : static_cast<const uint16_t*>(dst->data())[wrong])
                              << ", version 3 has 0x" << (wrong < 0 ? 0 : Bf16Of(3, wrong)));
  CHECK(wrong == -1);
  // And the pipeline is healthy afterwards.
  FillSource(&*src, 4);
  auto fourth = ctl->Step(4, std::chrono::seconds(20));
  INFO((fourth.ok() ? "" : std::string(fourth.status().message())));
  CHECK(fourth.ok());
  CHECK(FirstWrong(*dst, 4) == -1);
}

TEST_CASE("a receiver refuses writes of a step it did not begin; that step cannot commit",
          "[security]") {
  Cluster cluster(wb::testing::Runfile(""), {});
  auto sides = wb::testing::OneTensorSides::Open(cluster);
  auto ctl = wb::testing::ConnectController(cluster);
  const auto plan = wb::testing::PlanOneToOne(&ctl);
  sides.Fill(0x11);
  wb::testing::RequireCommitted(ctl.Step(1, std::chrono::seconds(20)));
  REQUIRE(sides.Same());
  const std::vector<uint8_t> version1(sides.src.size(), 0x11);
  auto untouched = [&] {
    return std::memcmp(sides.dst.data(), version1.data(), version1.size()) == 0;
  };

  // The test plays the controller, with step ids of its own.
  auto receiver = AgentStub(cluster, "inference-node");
  auto sender = AgentStub(cluster, "trainer-node");
  // One of the receiver's step calls (Begin, Commit, Abort) for (version, step_id).
  auto step_call = [&](auto rpc, auto req, auto resp, uint64_t version, uint64_t step_id) {
    req.set_version(version);
    req.set_step_id(step_id);
    return wb::testing::CallWithin(std::chrono::seconds(10), receiver.get(), rpc, req, &resp);
  };
  auto begin = [&](uint64_t version, uint64_t step_id) {
    v1::BeginRequest req;
    req.set_plan_id(plan.plan_id());
    return step_call(&v1::Agent::Stub::Begin, req, v1::BeginResponse{}, version, step_id);
  };
  auto commit = [&](uint64_t version, uint64_t step_id) {
    return step_call(&v1::Agent::Stub::Commit, v1::CommitRequest{}, v1::CommitResponse{}, version,
                     step_id);
  };
  auto abort = [&](uint64_t version, uint64_t step_id) {
    v1::AbortRequest req;
    req.set_reason("test");
    return step_call(&v1::Agent::Stub::Abort, req, v1::AbortResponse{}, version, step_id);
  };
  auto execute = [&](uint64_t version, uint64_t step_id) {
    v1::ExecuteRequest req;
    req.set_version(version);
    req.set_plan_id(plan.plan_id());
    req.set_step_id(step_id);
    req.set_timeout_ms(5000);
    v1::ExecuteResponse resp;
    grpc::Status st = wb::testing::CallWithin(std::chrono::seconds(30), sender.get(),
                                              &v1::Agent::Stub::Execute, req, &resp);
    INFO(st.error_message());
    REQUIRE(st.ok());
    return resp.report();
  };
  // The sender's write of (version, step_id) fails with an error that `why` matches.
  auto write_refused = [&](uint64_t version, uint64_t step_id, const auto& why) {
    auto report = execute(version, step_id);
    INFO(report.error());
    CHECK_FALSE(report.ok());
    CHECK_THAT(report.error(), why);
  };
  // The receiver refuses to commit (version, step_id), saying `why`.
  auto commit_refused = [&](uint64_t version, uint64_t step_id, const std::string& why) {
    wb::testing::CheckRefused(commit(version, step_id), grpc::StatusCode::FAILED_PRECONDITION, why);
  };

  sides.Fill(0x22);
  {
    INFO("a write of another step than the open one is refused untouched");
    REQUIRE(begin(2, 1001).ok());
    write_refused(2, 2002,  // a late writer of some other step
                  Catch::Contains("write of step 2002 refused") && Catch::Contains("step 1001"));
    CHECK(untouched());
    CHECK_THAT(cluster.Log("inference-node"), Catch::Contains("write of step 2002 refused"));
    CHECK(abort(2, 1001).ok());
  }
  {
    INFO("a step whose writes were refused cannot commit");
    // The sender writes before the receiver began the step: refused (no step is open).
    write_refused(3, 3003, Catch::Contains("no step is open"));
    REQUIRE(begin(3, 3003).ok());
    commit_refused(3, 3003, "refused by the step fence");
    CHECK(untouched());
  }
  {
    INFO("an aborted step's writes are refused, and it cannot commit");
    REQUIRE(begin(4, 4004).ok());
    REQUIRE(abort(4, 4004).ok());
    write_refused(4, 4004, Catch::Contains("write of step 4004 refused"));
    commit_refused(4, 4004, "not the step open here");
    CHECK(untouched());
  }
  {
    INFO("a late abort of an older step leaves the open one alone");
    REQUIRE(begin(5, 5005).ok());
    CHECK(abort(5, 4999).ok());
    auto report = execute(5, 5005);
    INFO(report.error());
    CHECK(report.ok());
    grpc::Status st = commit(5, 5005);
    INFO(st.error_message());
    CHECK(st.ok());
    CHECK(sides.Same());
  }
  // The controller's next step commits every byte.
  sides.Fill(0x33);
  wb::testing::RequireCommitted(ctl.Step(10, std::chrono::seconds(20)));
  CHECK(sides.Same());
  CHECK(cluster.agent("trainer-node")->running());
  CHECK(cluster.agent("inference-node")->running());
}
