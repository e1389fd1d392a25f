// CallAll, the controller's fan-out to agents, against real gRPC servers in this process: the
// answers come back in target order whatever order the agents answer in, a failing or absent
// agent fails alone, and a stalled agent ends at the deadline without holding up the others.
#include "controller/agent_calls.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::controller {
namespace {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

// An agent that answers Health with its own name as the state, after `delay`, or fails with
// `error` when set.
class FakeAgent final : public v1::Agent::Service {
 public:
  FakeAgent(std::string name, std::chrono::milliseconds delay, grpc::Status error)
      : name_(std::move(name)), delay_(delay), error_(std::move(error)) {}

  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse* resp) override {
    // Stalls until the delay passed or the test tears the server down.
    release_.WaitForNotificationWithTimeout(absl::FromChrono(delay_));
    if (!error_.ok()) return error_;
    resp->set_serving(true);
    resp->add_problems(name_);  // echoes who answered
    return grpc::Status::OK;
  }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  const std::string name_;
  const std::chrono::milliseconds delay_;
  const grpc::Status error_;
  absl::Notification release_;
};

// Which fake agent answered: each puts its own name in the reply.
std::string Who(const v1::HealthResponse& r) { return r.problems_size() == 1 ? r.problems(0) : ""; }

struct RunningAgent {
  std::unique_ptr<FakeAgent> service;
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;
};

RunningAgent Start(const std::string& name, std::chrono::milliseconds delay = {},
                   grpc::Status error = grpc::Status::OK) {
  RunningAgent a;
  a.service = std::make_unique<FakeAgent>(name, delay, error);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(a.service.get());
  a.server = builder.BuildAndStart();
  REQUIRE(a.server);
  REQUIRE(port > 0);
  a.endpoint = "127.0.0.1:" + std::to_string(port);
  return a;
}

void StopAll(std::vector<RunningAgent>* agents) {
  for (auto& a : *agents) a.service->Release();
  for (auto& a : *agents) a.server->Shutdown(std::chrono::system_clock::now());
}

std::vector<CallResult<v1::HealthResponse>> HealthAll(
    AgentChannels* channels, const std::vector<CallTarget<v1::HealthRequest>>& targets,
    std::chrono::milliseconds timeout) {
  return CallAll<v1::HealthRequest, v1::HealthResponse>(
      channels, targets, timeout,
      [](auto* s, auto* c, const auto& q, auto* cq) { return s->PrepareAsyncHealth(c, q, cq); });
}

TEST_CASE("answers come back in target order, whatever order the agents answer in") {
  // Later targets answer first: a result put at its arrival position would be reversed.
  std::vector<RunningAgent> agents;
  std::vector<CallTarget<v1::HealthRequest>> targets;
  for (int i = 0; i < 6; ++i) {
    const std::string name = "agent-" + std::to_string(i);
    agents.push_back(Start(name, std::chrono::milliseconds(50 * (6 - i))));
    targets.push_back({name, agents.back().endpoint, {}});
  }
  AgentChannels channels;
  const auto results = HealthAll(&channels, targets, std::chrono::milliseconds(10000));
  REQUIRE(results.size() == targets.size());
  for (size_t i = 0; i < results.size(); ++i) {
    INFO("target " << i);
    CHECK(results[i].agent == targets[i].agent);
    CHECK(results[i].status.ok());
    CHECK(Who(results[i].response) == targets[i].agent);  // this agent's own answer
  }
  // The same channels serve a second fan-out (stubs are reused, not rebuilt).
  const auto again = HealthAll(&channels, targets, std::chrono::milliseconds(10000));
  for (size_t i = 0; i < again.size(); ++i) CHECK(Who(again[i].response) == targets[i].agent);
  StopAll(&agents);
}

TEST_CASE("a failing agent and an absent one fail alone, with their own error") {
  std::vector<RunningAgent> agents;
  agents.push_back(Start("ok-0"));
  agents.push_back(Start("broken", {}, grpc::Status(grpc::StatusCode::INTERNAL, "disk on fire")));
  agents.push_back(Start("ok-1"));
  // A port nothing listens on: start a server and stop it, keeping its address.
  RunningAgent gone = Start("gone");
  gone.server->Shutdown();
  gone.server->Wait();
  std::vector<CallTarget<v1::HealthRequest>> targets = {{"ok-0", agents[0].endpoint, {}},
                                                        {"broken", agents[1].endpoint, {}},
                                                        {"gone", gone.endpoint, {}},
                                                        {"ok-1", agents[2].endpoint, {}}};
  AgentChannels channels;
  const auto results = HealthAll(&channels, targets, std::chrono::milliseconds(5000));
  REQUIRE(results.size() == 4);
  CHECK(results[0].status.ok());
  CHECK(Who(results[0].response) == "ok-0");
  CHECK(results[1].status.error_code() == grpc::StatusCode::INTERNAL);
  CHECK(results[1].status.error_message() == "disk on fire");
  CHECK(results[2].status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(results[3].status.ok());
  CHECK(Who(results[3].response) == "ok-1");
  CHECK(FailedCalls(results) ==
        "agent broken: disk on fire; agent gone: " + results[2].status.error_message());
  StopAll(&agents);
}

TEST_CASE("a stalled agent ends at the deadline and does not hold up the others") {
  std::vector<RunningAgent> agents;
  agents.push_back(Start("quick-0"));
  agents.push_back(Start("stalled", std::chrono::milliseconds(60000)));
  agents.push_back(Start("quick-1"));
  std::vector<CallTarget<v1::HealthRequest>> targets;
  for (size_t i = 0; i < agents.size(); ++i) {
    targets.push_back(
        {i == 1 ? "stalled" : "quick-" + std::to_string(i / 2), agents[i].endpoint, {}});
  }
  AgentChannels channels;
  const auto t0 = Clock::now();
  const auto results = HealthAll(&channels, targets, std::chrono::milliseconds(500));
  const auto took = Clock::now() - t0;
  // The stalled agent would answer after 60 s: returning at all means its call was ended.
  CHECK(took < std::chrono::seconds(30));
  REQUIRE(results.size() == 3);
  CHECK(results[0].status.ok());
  CHECK(Who(results[0].response) == "quick-0");
  CHECK(results[1].status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(results[2].status.ok());
  CHECK(Who(results[2].response) == "quick-1");
  StopAll(&agents);
}

TEST_CASE("no targets: no calls, no results") {
  AgentChannels channels;
  CHECK(HealthAll(&channels, {}, std::chrono::milliseconds(100)).empty());
}

}  // namespace
}  // namespace wb::controller
