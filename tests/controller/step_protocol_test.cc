// The step protocol against an in-process fleet: orderings that real agent processes cannot
// produce on demand (a sender failing mid-execute, a commit racing an abort, a deadline expiring
// with execute in flight). The multi-process tests in tests/integration cover the real wiring.
#include "controller/step_protocol.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
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
  // Each receiver holds one replica; both must commit (the strict floor) unless a test lowers it.
  spec.replicas = {{0, {"r0"}}, {1, {"r1"}}};
  spec.min_replicas = 2;
  return spec;
}

std::vector<int> Committed(const v1::StepResult& r) {
  return {r.committed_replicas().begin(), r.committed_replicas().end()};
}

std::vector<int> Skipped(const v1::StepResult& r) {
  std::vector<int> out;
  for (const auto& s : r.skipped_replicas()) out.push_back(s.replica());
  return out;
}

// Runs `spec` with the floor lowered to one replica; the step must commit to replica 0 alone,
// replica 1 dropped.
v1::StepResult RunDroppingReplica1(FakeAgentFleet* fleet, StepSpec spec) {
  spec.min_replicas = 1;
  StepProtocol protocol(fleet);
  v1::StepResult result;
  const absl::Status s = protocol.Run(spec, &result);
  INFO(s.message());
  REQUIRE(s.ok());
  CHECK(Committed(result) == std::vector<int>{0});
  REQUIRE(Skipped(result) == std::vector<int>{1});
  return result;
}

// Runs step `version` on a thread and aborts it (for `reason`) once each of `agents` received
// `phase`, then calls `after_abort`; returns the step's status.
absl::Status RunAbortedDuring(
    StepProtocol* protocol, FakeAgentFleet* fleet, uint64_t version, const Strings& agents,
    Phase phase, const std::string& reason, const std::function<void()>& after_abort = [] {}) {
  v1::StepResult result;
  absl::Status s;
  std::thread step([&] { s = protocol->Run(Spec(version), &result); });
  for (const auto& a : agents) REQUIRE(fleet->WaitFor(a, phase));
  protocol->AbortInFlight(reason);
  after_abort();
  step.join();
  return s;
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
  // Below the floor of 2 replicas: the step fails, naming the floor and the receiver.
  CHECK_THAT(std::string(s.message()),
             Catch::StartsWith("below min_replicas (2): began on 1 of 2 inference replica(s)") &&
                 Catch::Contains("replica 1 (" + expected + ")"));
  CHECK_FALSE(result.delta_anchor());  // set once begin succeeded
  CHECK(result.agents_size() == 0);
  for (const auto& r : kReceivers) CHECK(fleet.Events(r) == Strings{"begin 10", "abort 10"});
  for (const auto& a : kSenders) CHECK(fleet.Events(a) == Strings{"abort 10"});
  for (const auto& a : kEveryone) CHECK(fleet.AbortReasons(a) == Strings{std::string(s.message())});
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
  SECTION("dense: the failed receiver's watchers are told; the senders have nothing to undo") {
    v1::StepResult result;
    const absl::Status s = protocol.Run(Spec(11), &result);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(std::string(s.message()),
               Catch::StartsWith("below min_replicas (2): committed to 1 of 2") &&
                   Catch::Contains(expected));
    CHECK(Committed(result) == std::vector<int>{0});
    CHECK(Skipped(result) == std::vector<int>{1});
    CHECK(fleet.Events("r0") == Strings{"begin 11", "commit 11"});
    CHECK(fleet.Events("r1") == Strings{"begin 11", "commit 11", "abort 11"});
    for (const auto& a : kSenders) CHECK(fleet.Events(a) == Strings{"execute 11"});
  }
  SECTION("delta: the senders drop their shadows and the failed receiver is aborted") {
    StepSpec spec = Spec(11);
    spec.delta = true;
    spec.nonce = 5;
    v1::StepResult result;
    const absl::Status s = protocol.Run(spec, &result);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(std::string(s.message()), Catch::Contains(expected));
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
    const absl::Status s =
        RunAbortedDuring(&protocol, &fleet, 13, kSenders, Phase::kExecute, reason);
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
    const absl::Status s = RunAbortedDuring(&protocol, &fleet, 14, kReceivers, Phase::kCommit,
                                            reason, [&release] { release.Notify(); });
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("agent r1: commit failed: version 14 was aborted"));
    // r1 hears the in-flight abort, then its own (dropped from the step).
    CHECK(fleet.Events("r1") == Strings{"begin 14", "commit 14", "abort 14", "abort 14"});
    CHECK(fleet.AbortReasons("r1") ==
          Strings{reason, "agent r1: commit failed: version 14 was aborted"});
    // r0 committed before the abort reached it; the abort still does.
    CHECK(fleet.Events("r0") == Strings{"begin 14", "commit 14", "abort 14"});
    for (const auto& a : kSenders) CHECK(fleet.Events(a) == Strings{"execute 14", "abort 14"});
    for (const auto& a : {"r0", "s0", "s1"}) CHECK(fleet.AbortReasons(a) == Strings{reason});
  }

  SECTION("after the commit answered: no step is in flight, nobody is aborted") {
    v1::StepResult result;
    REQUIRE(protocol.Run(Spec(15), &result).ok());
    protocol.AbortInFlight(reason);
    for (const auto& a : kEveryone) CHECK_FALSE(fleet.Received(a, Phase::kAbort));
  }
}

// The commit policy (docs/elastic.md): a receiving replica that fails is dropped from the step,
// the others commit while at least min_replicas remain.

TEST_CASE("a replica failing begin is dropped: its agents abort, the others commit") {
  FakeAgentFleet fleet;
  fleet.Script("r1", Phase::kBegin, Failing(grpc::StatusCode::UNAVAILABLE, "connection refused"));
  const v1::StepResult result = RunDroppingReplica1(&fleet, Spec(20));
  CHECK(result.skipped_replicas(0).agents(0) == "r1");
  CHECK(result.skipped_replicas(0).reason() == "agent r1: begin failed: connection refused");
  CHECK(fleet.Events("r1") == Strings{"begin 20", "abort 20"});
  CHECK(fleet.Events("r0") == Strings{"begin 20", "commit 20"});
  // The senders leave out its ops.
  for (const auto& s : kSenders) {
    const auto exec = fleet.ExecuteRequestOf(s);
    REQUIRE(exec.skip_agents_size() == 1);
    CHECK(exec.skip_agents(0) == "r1");
  }
}

// Issue 41, item 8: an agent that sends and receives (a trainer and a replica on one node)
// whose replica drops out must keep sending: before, its abort cancelled its execute and
// discarded its capture, and the retry without the dropped replica failed.
TEST_CASE("an agent that sends and receives, dropped as a receiver, is aborted as one only") {
  FakeAgentFleet fleet;
  StepSpec spec = Spec(25);
  spec.senders = {"s0", "r1"};  // r1 holds trainer tensors too
  fleet.Script("r1", Phase::kBegin, Failing(grpc::StatusCode::UNAVAILABLE, "connection refused"));
  RunDroppingReplica1(&fleet, spec);
  CHECK(fleet.Events("r1") == Strings{"begin 25", "abort-receiving 25", "execute 25"});
  CHECK(fleet.Events("s0") == Strings{"execute 25"});
  // A relay-only agent dropped is aborted whole (it does not execute).
  FakeAgentFleet relays;
  StepSpec relayed = Spec(26);
  relayed.senders = {"s0", "s1", "r1"};
  relayed.relay_only = {"r1"};
  relays.Script("r1", Phase::kBegin, Failing(grpc::StatusCode::UNAVAILABLE, "refused"));
  RunDroppingReplica1(&relays, relayed);
  CHECK(relays.Events("r1") == Strings{"begin 26", "abort 26"});
}

TEST_CASE(
    "a replica unreachable when a sender fails is dropped; the senders run again without it") {
  FakeAgentFleet fleet;
  const bool delta = GENERATE(false, true);
  // s0's first attempt fails writing to r1 (r1 died); its second attempt succeeds.
  Reply first;
  first.report = Report(false, 10, 10, "op 3 (w -> r1:w): connection reset by peer");
  first.on_call = [&fleet] { fleet.Script("s0", Phase::kExecute, Reply{}); };
  fleet.Script("s0", Phase::kExecute, first);
  fleet.Script("r1", Phase::kHealth, Failing(grpc::StatusCode::UNAVAILABLE, "connection refused"));
  StepSpec spec = Spec(21);
  spec.delta = delta;
  spec.nonce = delta ? 77 : 0;
  spec.delta_base_version = delta ? 20 : 0;
  const v1::StepResult result = RunDroppingReplica1(&fleet, spec);
  CHECK_THAT(result.skipped_replicas(0).reason(),
             Catch::Contains("agent r1: unreachable during execute: connection refused"));
  const auto attempts = fleet.ExecuteRequestsOf("s0");
  REQUIRE(attempts.size() == 2);
  CHECK(attempts[0].skip_agents_size() == 0);
  REQUIRE(attempts[1].skip_agents_size() == 1);
  CHECK(attempts[1].skip_agents(0) == "r1");
  // A fresh attempt: dense in delta mode, with a nonce of its own; the commit says so.
  CHECK(attempts[1].delta_anchor() == delta);
  CHECK(result.delta_anchor() == delta);
  if (delta) {
    CHECK(attempts[1].step_nonce() != attempts[0].step_nonce());
    CHECK(fleet.CommitRequestOf("r0").step_nonce() == attempts[1].step_nonce());
    CHECK(fleet.CommitRequestOf("r0").delta_base_version() == 0);
  }
  // The result counts the attempt that committed.
  CHECK(result.agents_size() == 2);
  CHECK(fleet.Events("r1") == Strings{"begin 21", "abort 21"});
  CHECK(fleet.Events("r0") == Strings{"begin 21", "commit 21"});
}

TEST_CASE(
    "a replica restarted mid-step (it answers, its step is not open) is dropped, not blamed") {
  FakeAgentFleet fleet;
  // s0's first attempt fails writing to r1, whose agent restarted: the new process answers the
  // health check but never began this step.
  Reply first;
  first.report = Report(false, 10, 10, "op 3 (w -> r1:w): connection closed by the peer");
  first.on_call = [&fleet] { fleet.Script("s0", Phase::kExecute, Reply{}); };
  fleet.Script("s0", Phase::kExecute, first);
  Reply restarted;
  restarted.health.emplace();
  restarted.health->set_serving(true);
  restarted.health->set_step_open(false);
  fleet.Script("r1", Phase::kHealth, restarted);
  StepSpec spec = Spec(24);
  spec.step_id = 0x5eed;
  const v1::StepResult result = RunDroppingReplica1(&fleet, spec);
  CHECK_THAT(result.skipped_replicas(0).reason(),
             Catch::Contains("agent r1: the step is not open there any more"));
  const auto attempts = fleet.ExecuteRequestsOf("s0");
  REQUIRE(attempts.size() == 2);
  REQUIRE(attempts[1].skip_agents_size() == 1);
  CHECK(attempts[1].skip_agents(0) == "r1");
  CHECK(fleet.Events("r0") == Strings{"begin 24", "commit 24"});
}

TEST_CASE("a sender failure that no receiver explains fails the step, with no second attempt") {
  FakeAgentFleet fleet;
  fleet.Script("s1", Phase::kExecute,
               Reply{milliseconds(0), grpc::Status::OK, Report(false, 0, 0, "staging failed")});
  StepProtocol protocol(&fleet);
  StepSpec spec = Spec(22);
  spec.min_replicas = 1;
  v1::StepResult result;
  const absl::Status s = protocol.Run(spec, &result);
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.message()) == "agent s1: staging failed");
  CHECK(fleet.ExecuteRequestsOf("s1").size() == 1);
  CHECK(fleet.Received("r0", Phase::kHealth));
  for (const auto& a : kEveryone) CHECK_FALSE(fleet.Received(a, Phase::kCommit));
}

TEST_CASE("a commit failing on one replica drops it; the step commits to the others") {
  FakeAgentFleet fleet;
  fleet.Script("r1", Phase::kCommit, Failing(grpc::StatusCode::UNAVAILABLE, "Socket closed"));
  RunDroppingReplica1(&fleet, Spec(23));
  CHECK(fleet.Events("r1") == Strings{"begin 23", "commit 23", "abort 23"});
}

TEST_CASE("a replica spread over two agents is dropped whole when one of them fails") {
  FakeAgentFleet fleet;
  fleet.Script("r2", Phase::kBegin, Failing(grpc::StatusCode::UNAVAILABLE, "connection refused"));
  StepSpec spec = Spec(24);
  spec.receivers = {"r0", "r1", "r2"};
  spec.replicas = {{0, {"r0"}}, {1, {"r1", "r2"}}};
  const v1::StepResult result = RunDroppingReplica1(&fleet, spec);
  CHECK(result.skipped_replicas(0).agents_size() == 2);
  // r1 began fine but its replica is gone: aborted, never committed.
  CHECK(fleet.Events("r1") == Strings{"begin 24", "abort 24"});
  CHECK(fleet.Events("r0") == Strings{"begin 24", "commit 24"});
}

// A replica over two agents (tensor-parallel ranks on two nodes): receivers r1 and r2 hold
// replica 1, r0 holds replica 0.
StepSpec TwoAgentReplica(uint64_t version) {
  StepSpec spec = Spec(version);
  spec.receivers = {"r0", "r1", "r2"};
  spec.replicas = {{0, {"r0"}}, {1, {"r1", "r2"}}};
  return spec;
}

TEST_CASE("a replica over two agents announces a version on both of them or on neither") {
  FakeAgentFleet fleet;
  SECTION("one agent's commit fails: the other's watchers never see commit(v)") {
    fleet.Script("r2", Phase::kCommit,
                 Failing(grpc::StatusCode::FAILED_PRECONDITION,
                         "agent r2: 1 write(s) of version 27 were refused by the step fence"));
  }
  SECTION("one agent's commit outlasts the commit timeout (a long delta apply)") {
    fleet.Script("r2", Phase::kCommit, Reply{milliseconds(60000)});
  }
  const v1::StepResult result = RunDroppingReplica1(&fleet, TwoAgentReplica(27));
  CHECK(result.skipped_replicas(0).agents_size() == 2);
  CHECK_THAT(result.skipped_replicas(0).reason(), Catch::Contains("agent r2: commit failed"));
  // Replica 1's agents both withdraw version 27; replica 0 (one agent) commits in one call.
  CHECK(fleet.Watched("r1") == Strings{"abort 27"});
  CHECK(fleet.Watched("r2") == Strings{"abort 27"});
  CHECK(fleet.Watched("r0") == Strings{"commit 27"});
  CHECK(fleet.Events("r0") == Strings{"begin 27", "commit 27"});
}

TEST_CASE("a replica over two agents announces only after both prepared") {
  FakeAgentFleet fleet;
  StepProtocol protocol(&fleet);
  v1::StepResult result;
  REQUIRE(protocol.Run(TwoAgentReplica(28), &result).ok());
  CHECK(Committed(result) == std::vector<int>{0, 1});
  for (const std::string a : {"r1", "r2"}) {
    CHECK(fleet.Events(a) == Strings{"begin 28", "prepare 28", "announce 28"});
    CHECK(fleet.Watched(a) == Strings{"commit 28"});
  }
  // Both prepared before either announced.
  const Strings log = fleet.Log();
  for (const std::string a : {"r1", "r2"}) {
    CHECK(At(log, a + " prepare") < At(log, "r1 announce"));
    CHECK(At(log, a + " prepare") < At(log, "r2 announce"));
  }
}

TEST_CASE("a delta step tells the receivers the base version its deltas apply on") {
  FakeAgentFleet fleet;
  StepProtocol protocol(&fleet);
  StepSpec spec = Spec(25);
  spec.delta = true;
  spec.nonce = 9;
  spec.delta_base_version = 24;
  v1::StepResult result;
  REQUIRE(protocol.Run(spec, &result).ok());
  CHECK(fleet.CommitRequestOf("r0").delta_base_version() == 24);
  spec.anchor = true;
  spec.version = 26;
  REQUIRE(protocol.Run(spec, &result).ok());
  CHECK(fleet.CommitRequestOf("r0").delta_base_version() == 0);  // an anchor: any base
}

TEST_CASE("dropping closes over shared agents") {
  StepSpec spec;
  spec.receivers = {"a", "b", "c", "d"};
  // b holds parts of replicas 1 and 2; d is in no replica.
  spec.replicas = {{0, {"a"}}, {1, {"b"}}, {2, {"b", "c"}}};
  ReplicaBook book(spec);
  CHECK(book.total() == 4);
  auto excluded = book.Drop({{"c", "gone"}});
  CHECK(excluded == Strings{"b", "c"});
  CHECK(book.LiveReplicas() == std::vector<int>{-1, 0});
  CHECK(book.LiveReceivers() == Strings{"a", "d"});
  v1::StepResult r;
  book.Fill(&r);
  CHECK(Committed(r) == std::vector<int>{0});
  CHECK(Skipped(r) == std::vector<int>{1, 2});
}

}  // namespace
}  // namespace wb::controller
