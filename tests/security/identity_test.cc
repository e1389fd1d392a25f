// Identity without TLS (issue 14, class 5) with real processes: in the default insecure mode a
// RegisterAgent under a live agent's name from another endpoint must not take its place, and
// ListTensors must not hand out the region keys that authorize remote writes.
#include <grpcpp/grpcpp.h>

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

namespace {

std::unique_ptr<v1::Controller::Stub> Stub(const Cluster& cluster) {
  return v1::Controller::NewStub(
      grpc::CreateChannel(cluster.controller_address(), grpc::InsecureChannelCredentials()));
}

}  // namespace

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
