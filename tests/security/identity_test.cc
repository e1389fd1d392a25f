// Identity without TLS (issue 14, class 5) with real processes: in the default insecure mode a
// RegisterAgent under a live agent's name from another endpoint must not take its place, and
// ListTensors must not hand out the region keys that authorize remote writes; an agent restarted
// on another address gets its name back as soon as nothing answers at the old one (issue 31).
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/grpc_call.h"
#include "tests/support/one_tensor.h"
#include "weightbeam/v1/controller.grpc.pb.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<v1::Controller::Stub> Stub(const Cluster& cluster) {
  return v1::Controller::NewStub(
      grpc::CreateChannel(cluster.controller_address(), grpc::InsecureChannelCredentials()));
}

}  // namespace

// The control endpoint the controller holds for `agent`, or "" when it lists none.
std::string HeldEndpoint(v1::Controller::Stub* stub, const std::string& agent) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::StatusResponse resp;
  if (!stub->Status(&ctx, v1::StatusRequest(), &resp).ok()) return "";
  for (const auto& a : resp.agents()) {
    if (a.info().name() == agent) return a.info().control_endpoint();
  }
  return "";
}

TEST_CASE("a live agent's name cannot be taken and region keys are not listed", "[security]") {
  Cluster cluster(wb::testing::Runfile(""), {});
  auto sides = wb::testing::OneTensorSides::Open(cluster);
  auto stub = Stub(cluster);
  // Both agents registered with the controller and reported their tensors.
  REQUIRE(wb::testing::WaitUntil(
      [&] {
        grpc::ClientContext ctx;
        v1::ListTensorsRequest req;
        v1::ListTensorsResponse resp;
        if (!stub->ListTensors(&ctx, req, &resp).ok()) return false;
        int n = 0;
        for (const auto& l : resp.layouts()) n += l.tensors_size();
        return n == 2;
      },
      std::chrono::seconds(20)));

  SECTION("ListTensors carries no region keys") {
    grpc::ClientContext ctx;
    v1::ListTensorsRequest req;
    v1::ListTensorsResponse resp;
    REQUIRE(stub->ListTensors(&ctx, req, &resp).ok());
    for (const auto& l : resp.layouts()) {
      for (const auto& tensor : l.tensors()) {
        INFO(l.agent() << " " << tensor.spec().name());
        CHECK(tensor.region().keys_size() == 0);
      }
    }
  }

  // An impostor's RegisterAgent under the real inference agent's name, claiming `endpoint`:
  // refused while that agent lives.
  auto impostor_refused = [&](const std::string& endpoint) {
    v1::RegisterAgentRequest req;
    req.mutable_agent()->set_name("inference-node");
    req.mutable_agent()->set_control_endpoint(endpoint);
    req.set_incarnation("impostor-incarnation");
    v1::RegisterAgentResponse resp;
    grpc::Status st = wb::testing::CallWithin(std::chrono::seconds(10), stub.get(),
                                              &v1::Controller::Stub::RegisterAgent, req, &resp);
    wb::testing::CheckRefused(st, grpc::StatusCode::ALREADY_EXISTS, "held by a live agent");
    return resp;
  };
  // The real agents still make a step commit, every byte delivered.
  auto real_agents_commit = [&](uint8_t fill) {
    auto ctl = ControllerClient::Connect(cluster.controller_address());
    REQUIRE(ctl.ok());
    wb::testing::PlanOneToOne(&*ctl);
    sides.Fill(fill);
    auto step = ctl->Step(1);
    INFO((step.ok() ? "" : std::string(step.status().message())));
    REQUIRE(step.ok());
    CHECK(sides.Same());
  };

  SECTION("RegisterAgent claiming a live agent's own endpoint, from its host, is refused") {
    // A restarted agent (same host, same endpoint) takes its name at once, but only when the
    // process listening on that endpoint answers with the registering incarnation's digest:
    // here the real agent still listens there and answers with its own.
    impostor_refused(cluster.agent_address("inference-node"));
    real_agents_commit(0x37);
  }

  SECTION("RegisterAgent under a live agent's name from another endpoint is refused") {
    const v1::RegisterAgentResponse resp = impostor_refused("127.0.0.1:1");
    // Heartbeats from the impostor neither keep the name nor disturb the real agent.
    v1::HeartbeatRequest hb;
    hb.set_agent("inference-node");
    hb.set_epoch(resp.epoch());
    grpc::ClientContext hctx;
    v1::HeartbeatResponse hresp;
    REQUIRE(stub->Heartbeat(&hctx, hb, &hresp).ok());
    CHECK(hresp.reregister());
    real_agents_commit(0x42);
  }
}

TEST_CASE("an agent restarted on a new address takes its name at once when the old one is gone",
          "[security]") {
  wb::testing::ClusterOptions options;
  // The old wait for a name (the holder's heartbeat timeout): far beyond what is allowed below.
  options.heartbeat_timeout_ms = 20000;
  Cluster cluster(wb::testing::Runfile(""), options);
  auto stub = Stub(cluster);
  const std::string old_address = cluster.agent_address("inference-node");
  REQUIRE(wb::testing::WaitUntil(
      [&] { return HeldEndpoint(stub.get(), "inference-node") == old_address; },
      std::chrono::seconds(20)));

  // SIGKILLed and started again on another address (a rescheduled pod): nothing answers at the
  // old endpoint any more, so the controller lets the new incarnation in at its first tries.
  cluster.KillAgent("inference-node", SIGKILL);
  const auto t0 = Clock::now();
  REQUIRE(cluster.MoveAgent("inference-node"));
  const std::string new_address = cluster.agent_address("inference-node");
  REQUIRE(new_address != old_address);
  const bool moved = wb::testing::WaitUntil(
      [&] { return HeldEndpoint(stub.get(), "inference-node") == new_address; },
      std::chrono::seconds(8));
  INFO("controller holds " << HeldEndpoint(stub.get(), "inference-node") << " after "
                           << std::chrono::duration<double>(Clock::now() - t0).count() << " s");
  CHECK(moved);
  CHECK_THAT(cluster.Log("controller"), Catch::Contains("nothing answers at " + old_address));

  // The new incarnation answers at its endpoint: another process under its name from yet
  // another address is refused, again and again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    v1::RegisterAgentRequest req;
    req.mutable_agent()->set_name("inference-node");
    req.mutable_agent()->set_control_endpoint("127.0.0.1:1");
    req.set_incarnation("impostor-incarnation");
    v1::RegisterAgentResponse resp;
    grpc::Status st = wb::testing::CallWithin(std::chrono::seconds(10), stub.get(),
                                              &v1::Controller::Stub::RegisterAgent, req, &resp);
    wb::testing::CheckRefused(st, grpc::StatusCode::ALREADY_EXISTS, "held by a live agent");
  }
  CHECK(HeldEndpoint(stub.get(), "inference-node") == new_address);
}
