// Restarted agents rejoin the step protocol, with real processes on loopback: the trainer's agent
// SIGKILLed between steps or mid-step and restarted (as systemd's Restart=on-failure does), its
// trainer registering the same buffer again on a new session (the same layout as before); the
// trainer's agent and a replica's agent restarted together. Within a bounded number of steps,
// each answering within its deadline, steps commit to every replica again and every inference
// byte equals the trainer's; a step that cannot proceed yet fails naming what it waits for.
// (A controller restarted under live agents: step_test and scale_test.)
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/grpc_call.h"
#include "tests/support/two_tensor_sides.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using Clock = std::chrono::steady_clock;

namespace {

using namespace wb::testing::two_tensors;

// The trainer's agent holds every write of this version (executor test hook), so it can be
// killed while that step is in flight.
constexpr uint64_t kHeldVersion = 50;
constexpr char kTrainerAgent[] = "trainer-node";

// One process's side: a buffer that outlives its sessions (a trainer or worker whose agent
// restarts registers the same memory again, the same two tensors: the same layout).
struct Side {
  std::string agent;
  Identity who;
  std::unique_ptr<SharedBuffer> buffer;
  std::unique_ptr<LocalSession> session;

  absl::Status Register(const wb::testing::Cluster& cluster) {
    session.reset();
    auto s = LocalSession::Connect(cluster.socket(agent), who);
    if (!s.ok()) return s.status();
    for (int i = 0; i < 2; ++i) {
      TensorInfo t{i == 0 ? "a.weight" : "b.weight", v1::DTYPE_BF16, {kRows, kCols}, {}};
      if (auto r = s->Register(t, *buffer, i * kTensorBytes, kTensorBytes); !r.ok()) return r;
    }
    session = std::make_unique<LocalSession>(std::move(*s));
    return who.role == v1::ROLE_INFERENCE ? session->Watch() : absl::OkStatus();
  }

  // The next event of `kind` (skipping others), or an error after `timeout`.
  absl::StatusOr<v1::Event> Next(v1::Event::Kind kind, std::chrono::milliseconds timeout) {
    return NextEventOfKind(*session, kind, timeout);
  }
};

std::unique_ptr<Side> MakeSide(const std::string& agent, Identity who, uint8_t fill) {
  auto side = std::make_unique<Side>();
  side->agent = agent;
  side->who = who;
  auto b = SharedBuffer::Create(kSideBytes, absl::StrCat("rs-", agent));
  REQUIRE(b.ok());
  std::memset(b->data(), fill, kSideBytes);
  side->buffer = std::make_unique<SharedBuffer>(std::move(*b));
  return side;
}

// A trainer and two inference replicas, one agent each.
struct Fleet {
  std::unique_ptr<wb::testing::Cluster> cluster;
  std::unique_ptr<Side> trainer;
  std::vector<std::unique_ptr<Side>> replicas;
  std::unique_ptr<ControllerClient> ctl;
  uint64_t version = 0;
  std::vector<std::string> failures;  // errors of the steps that did not commit

  explicit Fleet(bool delta) {
    wb::testing::ClusterOptions opts;
    opts.agents = {kTrainerAgent, ReplicaAgent(0), ReplicaAgent(1)};
    opts.inference_replicas = 2;
    // The controller's default: an agent that restarts at once is back long before its old
    // incarnation would be declared lost.
    opts.heartbeat_timeout_ms = 5000;
    opts.agent_yaml[kTrainerAgent] =
        absl::StrCat("executor:\n  test_hold_version: ", kHeldVersion, "\n  test_hold_ms: 1000\n");
    if (delta) {
      opts.extra_controller_yaml = "delta:\n  enabled: true\n  anchor_every: 8\n  verify: true\n";
    }
    cluster = std::make_unique<wb::testing::Cluster>(wb::testing::Runfile(""), opts);
    trainer = MakeSide(kTrainerAgent, {v1::ROLE_TRAINER, 0, 0}, 0);
    REQUIRE(trainer->Register(*cluster).ok());
    for (int k = 0; k < 2; ++k) {
      replicas.push_back(MakeSide(ReplicaAgent(k), {v1::ROLE_INFERENCE, 0, k}, 0xEE));
      REQUIRE(replicas.back()->Register(*cluster).ok());
    }
    v1::PlanSummary plan;
    ctl = ConnectAndPlan(*cluster, 2, &plan);
    CHECK(plan.delta().enabled() == delta);
  }

  // Version v rewrites a third of the elements (which third depends on v): a replica that
  // applied a delta on the wrong base, or kept an old byte, differs.
  void Advance(uint64_t v) {
    auto* p = static_cast<uint16_t*>(trainer->buffer->data());
    for (uint64_t i = 0; i < kSideBytes / 2; ++i) {
      if ((i / 64 + v) % 3 == 0) p[i] = static_cast<uint16_t>(0x3c00 + ((i * 7 + v * 13) & 0x3ff));
    }
  }

  // One step with a fresh version; it must answer within its deadline (plus the RPC's slack).
  absl::StatusOr<v1::StepResult> Step() {
    ++version;
    Advance(version);
    const auto t0 = Clock::now();
    auto r = ctl->Step(version, kStepTimeout);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    INFO("step " << version << " took " << seconds
                 << " s: " << (r.ok() ? "committed" : Message(r.status())));
    CHECK(seconds < std::chrono::duration<double>(kStepTimeout).count() + 3);
    if (!r.ok()) failures.push_back(Message(r.status()));
    return r;
  }

  // Step kHeldVersion, whose writes the trainer's agent holds for 1 s each; `after` ms into it
  // (once replica 0 saw begin), `disrupt` runs (a kill, a restart) while the step is in flight.
  absl::StatusOr<v1::StepResult> StepDisruptedBy(std::chrono::milliseconds after,
                                                 const std::function<void()>& disrupt) {
    version = kHeldVersion - 1;
    std::thread disruptor([&] {
      auto e = replicas[0]->Next(v1::Event::KIND_BEGIN, std::chrono::seconds(20));
      if (!e.ok()) return;
      std::this_thread::sleep_for(after);
      disrupt();
    });
    auto r = Step();
    disruptor.join();
    return r;
  }

  // Every replica the step committed holds the trainer's bytes and saw commit(version).
  void VerifyCommitted(const v1::StepResult& r) {
    for (int k : r.committed_replicas()) {
      INFO("replica " << k << " at version " << r.version());
      CHECK(std::memcmp(trainer->buffer->data(), replicas[k]->buffer->data(), kSideBytes) == 0);
      auto e = replicas[k]->Next(v1::Event::KIND_COMMIT, std::chrono::seconds(5));
      REQUIRE(e.ok());
      CHECK(e->version() == r.version());
    }
  }

  // Two steps to both replicas, so that delta mode has a base everywhere.
  void WarmUp() {
    StepUntilBoth(3);
    StepUntilBoth(3);
  }

  // Steps until one commits to both replicas, at most `tries` steps; returns it.
  v1::StepResult StepUntilBoth(int tries) {
    for (int i = 0; i < tries; ++i) {
      auto r = Step();
      if (r.ok()) {
        VerifyCommitted(*r);
        if (r->committed_replicas_size() == 2) return *r;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::string seen;
    for (const auto& f : failures) absl::StrAppend(&seen, "\n  ", f);
    FAIL("no step committed to both replicas within " << tries << " steps; failures:" << seen);
    return {};
  }

  // Kills `agent` (SIGKILL), starts it again after `delay` and lets its process register the
  // same buffer again.
  void Restart(Side* side, std::chrono::milliseconds delay) {
    cluster->KillAgent(side->agent, SIGKILL);
    std::this_thread::sleep_for(delay);
    REQUIRE(cluster->StartAgent(side->agent));
    auto s = side->Register(*cluster);
    INFO(Message(s));
    REQUIRE(s.ok());
  }

  // While an agent is coming back, a step that does not commit says why, naming the agent or
  // the trainer rank it waits for.
  void CheckFailuresNamed(const std::vector<std::string>& names) {
    for (const auto& f : failures) {
      INFO(f);
      bool named = f.find("trainer rank 0") != std::string::npos;
      for (const auto& n : names) named = named || f.find(n) != std::string::npos;
      CHECK(named);
    }
    failures.clear();
  }
};

// Steps a restarted agent gets to rejoin (each at most kStepTimeout, 200 ms apart): its
// registration, its process registering again, one plan. Fewer than waiting out the 5 s
// heartbeat timeout of its old incarnation would take.
constexpr int kRejoinSteps = 10;

}  // namespace

TEST_CASE("the trainer's agent SIGKILLed between steps and restarted: steps commit again") {
  const bool delta = GENERATE(false, true);
  // At once (systemd's Restart=on-failure: the old incarnation is not yet lost) and after the
  // heartbeat timeout (it is).
  const int delay_ms = GENERATE(0, 6000);
  INFO((delta ? "delta mode" : "dense mode") << ", restarted after " << delay_ms << " ms");
  Fleet f(delta);
  f.WarmUp();

  for (int round = 0; round < (delay_ms == 0 ? 2 : 1); ++round) {
    INFO("restart " << round);
    f.Restart(f.trainer.get(), std::chrono::milliseconds(delay_ms));
    f.StepUntilBoth(kRejoinSteps);
    f.CheckFailuresNamed({kTrainerAgent});
    // And keeps committing (delta steps again after the anchor).
    const auto next = f.StepUntilBoth(1);
    if (delta) CHECK_FALSE(next.delta_anchor());
  }
}

TEST_CASE("the trainer's agent SIGKILLed mid-step fails that step by name; restarted, it rejoins") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense mode"));
  Fleet f(delta);
  f.WarmUp();

  // The trainer's agent holds each of version kHeldVersion's writes for 1 s: kill it meanwhile.
  auto r = f.StepDisruptedBy(std::chrono::milliseconds(300),
                             [&] { f.cluster->KillAgent(kTrainerAgent, SIGKILL); });
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(Message(r.status()), Catch::Contains(kTrainerAgent));
  for (auto& rep : f.replicas) {
    auto abort = rep->Next(v1::Event::KIND_ABORT, std::chrono::seconds(5));
    REQUIRE(abort.ok());
    CHECK(abort->version() == kHeldVersion);
  }
  f.failures.clear();

  REQUIRE(f.cluster->StartAgent(kTrainerAgent));
  REQUIRE(f.trainer->Register(*f.cluster).ok());
  f.StepUntilBoth(kRejoinSteps);
  f.CheckFailuresNamed({kTrainerAgent});
  f.StepUntilBoth(1);
}

TEST_CASE("a replica's agent restarted at once: steps go on to the other replica; it rejoins") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense mode"));
  Fleet f(delta);
  f.WarmUp();

  auto status = f.ctl->Status();
  REQUIRE(status.ok());
  const uint64_t old_plan = status->plan().plan_id();
  REQUIRE(old_plan != 0);
  f.Restart(f.replicas[0].get(), std::chrono::milliseconds(0));
  // The new process never heard of the plan made before it started: a Begin for that plan (a
  // controller that has not noticed the restart yet) is refused, naming it, so that receiver is
  // dropped from the step instead of its senders failing at the handshake; and it does not
  // claim a step it never began.
  auto agent = v1::Agent::NewStub(grpc::CreateChannel(f.cluster->agent_address(ReplicaAgent(0)),
                                                      grpc::InsecureChannelCredentials()));
  v1::BeginRequest begin;
  begin.set_version(1000);
  begin.set_plan_id(old_plan);
  begin.set_step_id(0xfeed);
  v1::BeginResponse begun;
  wb::testing::CheckRefused(
      wb::testing::CallWithin(std::chrono::seconds(10), agent.get(), &v1::Agent::Stub::Begin, begin,
                              &begun),
      grpc::StatusCode::FAILED_PRECONDITION,
      absl::StrCat("agent inference-0 was not introduced to plan ", old_plan));
  v1::HealthRequest health;
  health.set_step_id(0xfeed);
  v1::HealthResponse healthy;
  REQUIRE(wb::testing::CallWithin(std::chrono::seconds(10), agent.get(), &v1::Agent::Stub::Health,
                                  health, &healthy)
              .ok());
  CHECK(healthy.serving());
  CHECK_FALSE(healthy.step_open());

  // Until it is back, the restarted agent is skipped: no step fails, each commits replica 1.
  for (int i = 0; i < kRejoinSteps; ++i) {
    auto r = f.Step();
    INFO((r.ok() ? "" : Message(r.status())));
    REQUIRE(r.ok());
    f.VerifyCommitted(*r);
    REQUIRE(std::set<int>(r->committed_replicas().begin(), r->committed_replicas().end()).count(1));
    if (r->committed_replicas_size() == 2) break;
    REQUIRE(r->skipped_replicas_size() == 1);
    CHECK_THAT(r->skipped_replicas(0).reason(),
               Catch::Contains(ReplicaAgent(0)) || Catch::Contains("replica 0"));
    REQUIRE(i + 1 < kRejoinSteps);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  f.StepUntilBoth(1);
}

TEST_CASE(
    "a replica's agent restarted mid-step is dropped from that step, not blamed on the sender") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense mode"));
  Fleet f(delta);
  f.WarmUp();

  // The sender holds each write of kHeldVersion for 1 s; meanwhile replica 0's agent is killed
  // and restarted. The new process answers the health check after the sender's write to it
  // fails, but it never began this step: it is dropped, the sender runs again without it.
  auto r = f.StepDisruptedBy(std::chrono::milliseconds(200), [&] {
    f.cluster->KillAgent(ReplicaAgent(0), SIGKILL);
    f.cluster->StartAgent(ReplicaAgent(0));
  });
  INFO((r.ok() ? "" : Message(r.status())));
  REQUIRE(r.ok());
  CHECK(r->committed_replicas_size() == 1);
  REQUIRE(r->skipped_replicas_size() == 1);
  CHECK(r->skipped_replicas(0).replica() == 0);
  // Restarted before the health check (the usual case): "not open"; still coming up: unreachable.
  CHECK_THAT(r->skipped_replicas(0).reason(),
             Catch::Contains("inference-0") && (Catch::Contains("the step is not open there") ||
                                                Catch::Contains("unreachable during execute")));
  f.VerifyCommitted(*r);

  REQUIRE(f.replicas[0]->Register(*f.cluster).ok());
  f.StepUntilBoth(kRejoinSteps);
  f.StepUntilBoth(1);
}

TEST_CASE("the trainer's agent and a replica's agent restarted together: steps commit again") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense mode"));
  Fleet f(delta);
  f.WarmUp();

  f.cluster->KillAgent(kTrainerAgent, SIGKILL);
  f.Restart(f.replicas[0].get(), std::chrono::milliseconds(0));
  REQUIRE(f.cluster->StartAgent(kTrainerAgent));
  REQUIRE(f.trainer->Register(*f.cluster).ok());
  f.StepUntilBoth(kRejoinSteps);
  f.CheckFailuresNamed({kTrainerAgent, ReplicaAgent(0)});
  f.StepUntilBoth(1);
}
