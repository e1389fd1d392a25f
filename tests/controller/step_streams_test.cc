// StepStreams, the controller's step commands on one stream per agent, against real gRPC servers
// in this process: answers come back in order from one stream kept across fan-outs, an agent
// that stalls ends at the deadline and gets a fresh stream afterwards, an agent that goes away
// mid-stream fails its command with the stream's end, and an agent without the stream (an older
// build) is reported as such so the caller can fall back to unary calls.
#include "controller/step_streams.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::controller {
namespace {

namespace v1 = weightbeam::v1;

// Answers each command with its seq and, as the error, this agent's name; the first `stall`
// commands get no answer at all. Counts the streams opened.
class FakeStreamAgent final : public v1::Agent::CallbackService {
 public:
  FakeStreamAgent(std::string name, int stall) : name_(std::move(name)), stall_(stall) {}

  grpc::ServerBidiReactor<v1::StepCommand, v1::StepReply>* StepStream(
      grpc::CallbackServerContext*) override {
    ++streams_;
    return new Reactor(this);
  }
  int streams() const { return streams_; }

 private:
  class Reactor : public grpc::ServerBidiReactor<v1::StepCommand, v1::StepReply> {
   public:
    explicit Reactor(FakeStreamAgent* agent) : agent_(agent) { StartRead(&in_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      if (agent_->stall_-- > 0) {
        StartRead(&in_);
        return;
      }
      out_.set_seq(in_.seq());
      out_.set_code(static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
      out_.set_error(agent_->name_);
      StartWrite(&out_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::OK);
      StartRead(&in_);
    }
    void OnDone() override { delete this; }

   private:
    FakeStreamAgent* agent_;
    v1::StepCommand in_;
    v1::StepReply out_;
  };

  const std::string name_;
  std::atomic<int> stall_;
  std::atomic<int> streams_{0};
};

// An agent of an older build: no StepStream.
class OldAgent final : public v1::Agent::Service {};

struct Running {
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;
};

Running Serve(std::unique_ptr<grpc::Service> service) {
  Running r;
  r.service = std::move(service);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(r.service.get());
  r.server = builder.BuildAndStart();
  REQUIRE(r.server);
  r.endpoint = "127.0.0.1:" + std::to_string(port);
  return r;
}

std::vector<v1::StepCommand> Commands(size_t n) {
  std::vector<v1::StepCommand> out(n);
  for (auto& c : out) c.mutable_begin()->set_version(7);
  return out;
}

TEST_CASE("answers come back in order, on one stream per agent kept across fan-outs") {
  std::vector<Running> agents;
  std::vector<std::string> endpoints;
  for (int i = 0; i < 4; ++i) {
    agents.push_back(Serve(std::make_unique<FakeStreamAgent>("agent-" + std::to_string(i), 0)));
    endpoints.push_back(agents.back().endpoint);
  }
  AgentChannels channels;
  {
    StepStreams streams(&channels);
    for (int round = 0; round < 3; ++round) {
      auto commands = Commands(endpoints.size());
      const auto answers = streams.Send(endpoints, &commands, std::chrono::seconds(10));
      REQUIRE(answers.size() == endpoints.size());
      for (size_t i = 0; i < answers.size(); ++i) {
        INFO("round " << round << ", agent " << i);
        CHECK(answers[i].status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
        CHECK(answers[i].status.error_message() == "agent-" + std::to_string(i));
        CHECK_FALSE(answers[i].not_sent);
      }
    }
    for (auto& a : agents) CHECK(static_cast<FakeStreamAgent*>(a.service.get())->streams() == 1);
  }  // the streams end with StepStreams
  for (auto& a : agents) a.server->Shutdown(std::chrono::system_clock::now());
}

TEST_CASE("a stalled agent ends at the deadline alone and gets a new stream next time") {
  Running ok = Serve(std::make_unique<FakeStreamAgent>("ok", 0));
  Running stalled = Serve(std::make_unique<FakeStreamAgent>("stalled", 1));
  AgentChannels channels;
  StepStreams streams(&channels);
  const std::vector<std::string> endpoints = {ok.endpoint, stalled.endpoint};
  auto commands = Commands(2);
  const auto t0 = std::chrono::steady_clock::now();
  auto answers = streams.Send(endpoints, &commands, std::chrono::milliseconds(300));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  CHECK(answers[0].status.error_message() == "ok");
  CHECK(answers[1].status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  // The stalled stream was given up; the agent answers on a new one.
  commands = Commands(2);
  answers = streams.Send(endpoints, &commands, std::chrono::seconds(10));
  CHECK(answers[0].status.error_message() == "ok");
  CHECK(answers[1].status.error_message() == "stalled");
  CHECK(static_cast<FakeStreamAgent*>(stalled.service.get())->streams() == 2);
  CHECK(static_cast<FakeStreamAgent*>(ok.service.get())->streams() == 1);
  ok.server->Shutdown(std::chrono::system_clock::now());
  stalled.server->Shutdown(std::chrono::system_clock::now());
}

TEST_CASE("an agent that goes away mid-stream fails its command with the stream's end") {
  // It never answers; its server goes down while the command waits.
  Running going = Serve(std::make_unique<FakeStreamAgent>("going", 1));
  AgentChannels channels;
  StepStreams streams(&channels);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    going.server->Shutdown(std::chrono::system_clock::now());
  });
  auto commands = Commands(1);
  const auto answers = streams.Send({going.endpoint}, &commands, std::chrono::seconds(20));
  stopper.join();
  REQUIRE(answers.size() == 1);
  CHECK_FALSE(answers[0].status.ok());
  CHECK(answers[0].status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(answers[0].status.error_message().find("step stream") != std::string::npos);
}

TEST_CASE("an agent without the stream is reported unimplemented; the command never ran") {
  Running old = Serve(std::make_unique<OldAgent>());
  AgentChannels channels;
  StepStreams streams(&channels);
  auto commands = Commands(1);
  const auto answers = streams.Send({old.endpoint}, &commands, std::chrono::seconds(10));
  REQUIRE(answers.size() == 1);
  CHECK(answers[0].not_sent);
  CHECK(answers[0].status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  // The next fan-out knows it without asking; a new registration makes it try again.
  auto again = Commands(1);
  streams.Send({old.endpoint}, &again, std::chrono::seconds(10));
  CHECK_FALSE(streams.Streams(old.endpoint));
  streams.Reset(old.endpoint);
  CHECK(streams.Streams(old.endpoint));
  old.server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace wb::controller
