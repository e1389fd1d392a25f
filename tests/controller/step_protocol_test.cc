// The step protocol against an in-process fleet: orderings that real agent processes cannot
// produce on demand (a sender failing mid-execute, a commit racing an abort, a deadline expiring
// with execute in flight). The multi-process tests in tests/integration cover the real wiring.
#include "controller/step_protocol.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "tests/controller/fake_agent_fleet.h"

namespace wb::controller {
namespace {

namespace v1 = weightbeam::v1;
using std::chrono::milliseconds;
using testing::FakeAgentFleet;
using testing::Phase;
using testing::Reply;
using Strings = std::vector<std::string>;

const Strings kSenders = {"s0", "s1"};
const Strings kReceivers = {"r0", "r1"};
const Strings kEveryone = {"s0", "s1", "r0", "r1"};

StepSpec Spec(uint64_t version, milliseconds timeout = milliseconds(10000)) {
  StepSpec spec;
  spec.version = version;
  spec.plan_id = 3;
  spec.senders = kSenders;
  spec.receivers = kReceivers;
  spec.started = std::chrono::steady_clock::now();
  spec.timeout = timeout;
  return spec;
}

v1::AgentStepReport Report(bool ok, uint64_t bytes, uint64_t dense, const std::string& error = "") {
  v1::AgentStepReport r;
  r.set_ok(ok);
  r.set_error(error);
  r.set_bytes_sent(bytes);
  r.set_bytes_dense(dense);
  return r;
}

Reply Failing(grpc::StatusCode code, const std::string& message, milliseconds delay = {}) {
  Reply r;
  r.status = grpc::Status(code, message);
  r.delay = delay;
  return r;
}

// Position of `entry` in the fleet's arrival log (-1 when absent).
int At(const Strings& log, const std::string& entry) {
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i] == entry) return static_cast<int>(i);
  }
  return -1;
}

TEST_CASE("a step begins on every receiver, executes on every sender, then commits") {
  FakeAgentFleet fleet;
  StepProtocol protocol(&fleet);
  StepSpec spec = Spec(7);
  spec.delta = true;
  spec.anchor = true;
  spec.nonce = 0xfeed;
  v1::StepResult result;
  REQUIRE(protocol.Run(spec, &result).ok());

  for (const auto& r : kReceivers) CHECK(fleet.Events(r) == Strings{"begin 7", "commit 7"});
  for (const auto& s : kSenders) CHECK(fleet.Events(s) == Strings{"execute 7"});
  // The barrier: no sender starts before every receiver began; no commit before every sender
  // answered.
  const Strings log = fleet.Log();
  for (const auto& s : kSenders) {
    for (const auto& r : kReceivers) {
      CHECK(At(log, r + " begin") < At(log, s + " execute"));
      CHECK(At(log, s + " execute") < At(log, r + " commit"));
    }
  }
  const v1::ExecuteRequest exec = fleet.ExecuteRequestOf("s1");
  CHECK(exec.version() == 7);
  CHECK(exec.plan_id() == 3);
  CHECK(exec.delta_anchor());
  CHECK(exec.step_nonce() == 0xfeed);
  CHECK(exec.timeout_ms() > 0);
  CHECK(exec.timeout_ms() <= 10000);
  CHECK(fleet.CommitRequestOf("r0").step_nonce() == 0xfeed);
  CHECK(result.delta_anchor());
}

TEST_CASE("the result sums the senders' bytes and op counts and keeps each sender's timings") {
  FakeAgentFleet fleet;
  v1::AgentStepReport s0 = Report(true, 1000, 4000);
  s0.set_delta_ops(3);
  s0.set_dense_ops(1);
  s0.set_seconds(0.25);
  s0.mutable_stages()->set_write_seconds(0.125);
  // Verification hashes go to the receiver that holds the range, not into the result.
  for (const auto& dst : kReceivers) {
    v1::OpHash* h = s0.add_hashes();
    h->set_op_id(dst == "r0" ? 1 : 2);
    h->set_dst_agent(dst);
    h->set_hash(dst == "r0" ? 11 : 22);
  }
  v1::AgentStepReport s1 = Report(true, 500, 500);
  s1.set_dense_ops(2);
  s1.set_seconds(0.5);
  fleet.Script("s0", Phase::kExecute, Reply{milliseconds(0), grpc::Status::OK, s0});
  fleet.Script("s1", Phase::kExecute, Reply{milliseconds(0), grpc::Status::OK, s1});
  StepProtocol protocol(&fleet);
  v1::StepResult result;
  REQUIRE(protocol.Run(Spec(8), &result).ok());

  CHECK(result.bytes() == 1500);
  CHECK(result.bytes_dense() == 4500);
  CHECK(result.delta_ops() == 3);
  CHECK(result.dense_ops() == 3);
  REQUIRE(result.agents_size() == 2);
  CHECK(result.agents(0).agent() == "s0");
  CHECK(result.agents(0).seconds() == 0.25);
  CHECK(result.agents(0).stages().write_seconds() == 0.125);
  CHECK(result.agents(1).agent() == "s1");
  CHECK(result.agents(1).seconds() == 0.5);
  CHECK(result.agents(0).hashes_size() == 0);
  const v1::CommitRequest r0 = fleet.CommitRequestOf("r0");
  REQUIRE(r0.expected_hashes_size() == 1);
  CHECK(r0.expected_hashes(0).hash() == 11);
  const v1::CommitRequest r1 = fleet.CommitRequestOf("r1");
  REQUIRE(r1.expected_hashes_size() == 1);
  CHECK(r1.expected_hashes(0).hash() == 22);
}

TEST_CASE("a sender failing mid-execute aborts everywhere and never commits") {
  FakeAgentFleet fleet;
  StepProtocol protocol(&fleet);
  const std::string cause = "op 4 (w.0 -> r1:w.0): connection reset by peer";
  SECTION("its report says why") {
    fleet.Script("s1", Phase::kExecute,
                 Reply{milliseconds(50), grpc::Status::OK, Report(false, 64, 64, cause)});
    v1::StepResult result;
    const absl::Status s = protocol.Run(Spec(9), &result);
    REQUIRE_FALSE(s.ok());
    CHECK(std::string(s.message()) == "agent s1: " + cause);
    // What it sent before failing still counts, and its report names it.
    CHECK(result.bytes() == 64);
    REQUIRE(result.agents_size() == 2);
    CHECK(result.agents(1).agent() == "s1");
    CHECK(result.agents(1).error() == cause);
  }
  SECTION("it is unreachable") {
    fleet.Script("s1", Phase::kExecute, Failing(grpc::StatusCode::UNAVAILABLE, "Socket closed"));
    v1::StepResult result;
    const absl::Status s = protocol.Run(Spec(9), &result);
    REQUIRE_FALSE(s.ok());
    CHECK(std::string(s.message()) == "agent s1: unreachable: Socket closed");
  }
  for (const auto& r : kReceivers) CHECK(fleet.Events(r) == Strings{"begin 9", "abort 9"});
  for (const auto& s : kSenders) CHECK(fleet.Events(s) == Strings{"execute 9", "abort 9"});
  CHECK_THAT(fleet.AbortReasons("r0").at(0), Catch::Contains("agent s1: "));
}

TEST_CASE("a receiver failing begin fails the step naming it; no sender executes") {
  FakeAgentFleet fleet;
  StepProtocol protocol(&fleet);
  std::string expected;
  milliseconds timeout(10000);
  SECTION("it refuses") {
    fleet.Script("r1", Phase::kBegin,
                 Failing(grpc::StatusCode::FAILED_PRECONDITION,
                         "version 10 is not newer than the committed version 12"));
    expected = "agent r1: begin failed: version 10 is not newer than the committed version 12";
  }
  SECTION("it stalls past the begin timeout") {
    timeout = milliseconds(1000);  // begin waits 1 s to 5 s, never past the step deadline
    fleet.Script("r1", Phase::kBegin, Reply{milliseconds(60000)});
    expected =
        "agent r1: begin failed: no answer before the deadline (agent stalled or overloaded)";
  }
  StepSpec spec = Spec(10, timeout);
  spec.delta = true;
  spec.anchor = true;
  v1::StepResult result;
  const absl::Status s = protocol.Run(spec, &result);
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.message()) == expected);
  CHECK_FALSE(result.delta_anchor());  // set once begin succeeded
  CHECK(result.agents_size() == 0);
  for (const auto& r : kReceivers) CHECK(fleet.Events(r) == Strings{"begin 10", "abort 10"});
  for (const auto& a : kSenders) CHECK(fleet.Events(a) == Strings{"abort 10"});
  for (const auto& a : kEveryone) CHECK(fleet.AbortReasons(a) == Strings{expected});
}

TEST_CASE("a commit failing after other receivers committed is reported by name") {
  FakeAgentFleet fleet;
  // r0 commits at once; r1 refuses after it.
  fleet.Script("r1", Phase::kCommit,
               Failing(grpc::StatusCode::DATA_LOSS, "delta mode on agent r1: op 2 hash mismatch",
                       milliseconds(100)));
  StepProtocol protocol(&fleet);
  const std::string expected =
      "agent r1: commit failed: delta mode on agent r1: op 2 hash mismatch";
  SECTION("dense: nothing to undo, nobody is told to abort") {
    v1::StepResult result;
    const absl::Status s = protocol.Run(Spec(11), &result);
    REQUIRE_FALSE(s.ok());
    CHECK(std::string(s.message()) == expected);
    CHECK(fleet.Events("r0") == Strings{"begin 11", "commit 11"});
    CHECK(fleet.Events("r1") == Strings{"begin 11", "commit 11"});
    for (const auto& a : kSenders) CHECK(fleet.Events(a) == Strings{"execute 11"});
  }
  SECTION("delta: the senders drop their shadows and the failed receiver is aborted") {
    StepSpec spec = Spec(11);
    spec.delta = true;
    spec.nonce = 5;
    v1::StepResult result;
    const absl::Status s = protocol.Run(spec, &result);
    REQUIRE_FALSE(s.ok());
    CHECK(std::string(s.message()) == expected);
    CHECK(fleet.Events("r0") == Strings{"begin 11", "commit 11"});
    CHECK(fleet.Events("r1") == Strings{"begin 11", "commit 11", "abort 11"});
    for (const auto& a : kSenders) CHECK(fleet.Events(a) == Strings{"execute 11", "abort 11"});
    CHECK(fleet.AbortReasons("s0") == Strings{expected});
  }
}

TEST_CASE("a step deadline expiring while execute is in flight aborts everywhere") {
  FakeAgentFleet fleet;
  StepProtocol protocol(&fleet);
  const StepSpec spec = Spec(12, milliseconds(300));
  std::string expected;
  SECTION("the sender's executor stops at the deadline it was given") {
    Reply late;
    late.delay = milliseconds(300);
    late.report = Report(false, 0, 0, "1 operation(s) still unacknowledged at the step deadline");
    fleet.Script("s0", Phase::kExecute, late);
    expected = "agent s0: 1 operation(s) still unacknowledged at the step deadline";
  }
  SECTION("the sender never answers") {
    fleet.Script("s0", Phase::kExecute, Reply{milliseconds(60000)});
    expected = "agent s0: no answer within the step timeout";
  }
  const auto t0 = std::chrono::steady_clock::now();
  v1::StepResult result;
  const absl::Status s = protocol.Run(spec, &result);
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.message()) == expected);
  // Execute was told the step's deadline, and its fan-out waits 2 s more for the answer.
  CHECK(fleet.ExecuteRequestOf("s0").timeout_ms() <= 300);
  CHECK(fleet.TimeoutOf("s0", Phase::kExecute) <= milliseconds(2300));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  for (const auto& r : kReceivers) CHECK(fleet.Events(r) == Strings{"begin 12", "abort 12"});
  for (const auto& a : kSenders) CHECK(fleet.Events(a) == Strings{"execute 12", "abort 12"});
}

TEST_CASE("an abort from another thread reaches every agent of the step in flight") {
  FakeAgentFleet fleet;
  StepProtocol protocol(&fleet);
  const std::string reason = "controller shutting down (SIGTERM)";

  SECTION("during execute: the senders cancel, the step fails naming them, nothing commits") {
    for (const auto& a : kSenders) {
      Reply cancelled;
      cancelled.on_call = [&fleet] {
        for (const auto& b : kEveryone) fleet.WaitFor(b, Phase::kAbort);
      };
      cancelled.report = Report(false, 0, 0, "step cancelled: " + reason);
      fleet.Script(a, Phase::kExecute, cancelled);
    }
    v1::StepResult result;
    absl::Status s;
    std::thread step([&] { s = protocol.Run(Spec(13), &result); });
    REQUIRE(fleet.WaitFor("s0", Phase::kExecute));
    REQUIRE(fleet.WaitFor("s1", Phase::kExecute));
    protocol.AbortInFlight(reason);
    step.join();
    CHECK(std::string(s.message()) ==
          "agent s0: step cancelled: " + reason + "; agent s1: step cancelled: " + reason);
    for (const auto& a : kEveryone) CHECK_FALSE(fleet.Received(a, Phase::kCommit));
    // The in-flight abort first, then the protocol's own.
    for (const auto& a : kEveryone) CHECK(fleet.AbortReasons(a).at(0) == reason);
    for (const auto& r : kReceivers) {
      CHECK(fleet.Events(r) == Strings{"begin 13", "abort 13", "abort 13"});
    }
  }

  SECTION("during commit: a receiver that refuses after the abort fails the step by name") {
    absl::Notification release;
    Reply racing;
    racing.on_call = [&release] { release.WaitForNotification(); };
    racing.answer = [&fleet] {
      return fleet.Received("r1", Phase::kAbort)
                 ? grpc::Status(grpc::StatusCode::ABORTED, "version 14 was aborted")
                 : grpc::Status::OK;
    };
    fleet.Script("r1", Phase::kCommit, racing);
    v1::StepResult result;
    absl::Status s;
    std::thread step([&] { s = protocol.Run(Spec(14), &result); });
    REQUIRE(fleet.WaitFor("r0", Phase::kCommit));
    REQUIRE(fleet.WaitFor("r1", Phase::kCommit));
    protocol.AbortInFlight(reason);
    release.Notify();
    step.join();
    CHECK(std::string(s.message()) == "agent r1: commit failed: version 14 was aborted");
    CHECK(fleet.Events("r1") == Strings{"begin 14", "commit 14", "abort 14"});
    // r0 committed before the abort reached it; the abort still does.
    CHECK(fleet.Events("r0") == Strings{"begin 14", "commit 14", "abort 14"});
    for (const auto& a : kSenders) CHECK(fleet.Events(a) == Strings{"execute 14", "abort 14"});
    for (const auto& a : kEveryone) CHECK(fleet.AbortReasons(a) == Strings{reason});
  }

  SECTION("after the commit answered: no step is in flight, nobody is aborted") {
    v1::StepResult result;
    REQUIRE(protocol.Run(Spec(15), &result).ok());
    protocol.AbortInFlight(reason);
    for (const auto& a : kEveryone) CHECK_FALSE(fleet.Received(a, Phase::kAbort));
  }
}

}  // namespace
}  // namespace wb::controller
