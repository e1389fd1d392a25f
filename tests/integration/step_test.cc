// The controller's step protocol with real processes: a controller and two agents over
// loopback tcp, a trainer and an inference session registering real shared memory. Several
// steps land verified bytes; an agent killed mid-step fails that step promptly, naming it; the
// next step succeeds once it is back; versions must go forward.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <regex>
#include <thread>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

// 32 MiB of BF16 per tensor: more than loopback socket buffers hold, so a frozen receiver
// stalls the sender mid-transfer.
constexpr int64_t kRows = 16384, kCols = 1024;

TensorInfo Weight(const std::string& name, v1::DType dtype) {
  return TensorInfo{name, dtype, {kRows, kCols}, {}};
}

// One side's two BF16 tensors, a.weight and b.weight, in one shared buffer.
std::pair<SharedBuffer, LocalSession> OpenSide(const std::string& socket, v1::Role role) {
  auto b = SharedBuffer::Create(2 * kRows * kCols * 2, "side");
  REQUIRE(b.ok());
  auto s = LocalSession::Connect(socket, Identity{role, 0, 0});
  REQUIRE(s.ok());
  const uint64_t bytes = kRows * kCols * 2;
  REQUIRE(s->Register(Weight("a.weight", v1::DTYPE_BF16), *b, 0, bytes).ok());
  REQUIRE(s->Register(Weight("b.weight", v1::DTYPE_BF16), *b, bytes, bytes).ok());
  return {std::move(*b), std::move(*s)};
}

// The trainer side: two BF16 tensors in one shared buffer, values derived from `version`.
struct Trainer {
  SharedBuffer buffer;
  LocalSession session;
  static Trainer Open(const std::string& socket) {
    auto [buffer, session] = OpenSide(socket, v1::ROLE_TRAINER);
    return Trainer{std::move(buffer), std::move(session)};
  }
  void Fill(uint32_t version) {
    auto* p = static_cast<uint16_t*>(buffer.data());
    for (int64_t i = 0; i < 2 * kRows * kCols; ++i) {
      p[i] = static_cast<uint16_t>(0x3c00 + ((i * 7 + version * 13) & 0x3ff));
    }
  }
};

// The inference side: the same two tensors as destinations.
struct Inference {
  SharedBuffer buffer;
  LocalSession session;
  static Inference Open(const std::string& socket) {
    auto [buffer, session] = OpenSide(socket, v1::ROLE_INFERENCE);
    REQUIRE(session.Watch().ok());
    return Inference{std::move(buffer), std::move(session)};
  }
};

bool SameBytes(const Trainer& t, const Inference& i) {
  return std::memcmp(t.buffer.data(), i.buffer.data(), t.buffer.size()) == 0;
}

}  // namespace

TEST_CASE("steps commit verified bytes; a killed agent fails its step by name; it rejoins") {
  Cluster cluster(wb::testing::Runfile(""), {});
  Trainer trainer = Trainer::Open(cluster.socket("trainer-node"));
  Inference inference = Inference::Open(cluster.socket("inference-node"));
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  const v1::PlanSummary plan = wb::testing::PlanOneToOne(&ctl);
  CHECK(plan.total_bytes() == 2 * kRows * kCols * 2);

  for (uint32_t v = 1; v <= 3; ++v) {
    trainer.Fill(v);
    auto step = ctl.Step(v);
    INFO((step.ok() ? "" : std::string(step.status().message())));
    REQUIRE(step.ok());
    CHECK(step->bytes() == 2 * kRows * kCols * 2);
    CHECK(SameBytes(trainer, inference));
    // The inference process saw begin, then commit, of this version.
    auto begin = inference.session.NextEvent(std::chrono::seconds(5));
    REQUIRE(begin.ok());
    CHECK(begin->kind() == v1::Event::KIND_BEGIN);
    CHECK(begin->version() == v);
    auto commit = inference.session.NextEvent(std::chrono::seconds(5));
    REQUIRE(commit.ok());
    CHECK(commit->kind() == v1::Event::KIND_COMMIT);
    CHECK(commit->version() == v);
  }

  SECTION("a version not newer than the last commit is refused") {
    auto old = ctl.Step(2);
    REQUIRE_FALSE(old.ok());
    CHECK_THAT(std::string(old.status().message()),
               Catch::Contains("version 2 is not newer than the last committed version 3"));
  }

  SECTION("the controller killed and restarted: agents re-register, same plan, next step works") {
    cluster.RestartController(SIGKILL);
    auto again = ControllerClient::Connect(cluster.controller_address());
    REQUIRE(again.ok());
    // Agents notice the new incarnation on their next heartbeat and register again.
    absl::StatusOr<v1::PlanSummary> replanned = absl::UnknownError("not run");
    for (int i = 0; i < 50 && !replanned.ok(); ++i) {
      replanned = again->Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(5));
      if (!replanned.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    INFO((replanned.ok() ? "" : std::string(replanned.status().message())));
    REQUIRE(replanned.ok());
    CHECK(replanned->plan_hash() == plan.plan_hash());
    trainer.Fill(10);
    // The new controller starts with no committed version; any newer version works.
    auto step = again->Step(10);
    INFO((step.ok() ? "" : std::string(step.status().message())));
    REQUIRE(step.ok());
    CHECK(SameBytes(trainer, inference));
  }

  SECTION("the sending agent killed mid-step fails that step, naming it; it rejoins") {
    trainer.Fill(4);
    // When the step begins, freeze the receiving agent so the sender is stuck mid-transfer,
    // kill the sender, then let the receiver go on.
    std::thread killer([&] {
      auto e = inference.session.NextEvent(std::chrono::seconds(20));
      if (e.ok() && e->kind() == v1::Event::KIND_BEGIN) {
        cluster.KillAgent("inference-node", SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        cluster.KillAgent("trainer-node", SIGKILL);
        cluster.KillAgent("inference-node", SIGCONT);
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    auto step = ctl.Step(4, std::chrono::seconds(15));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    killer.join();
    REQUIRE_FALSE(step.ok());
    CHECK_THAT(std::string(step.status().message()), Catch::Contains("trainer-node"));
    CHECK(seconds < 10);  // failed on the lost connection, not by waiting out the timeout
    auto abort = inference.session.NextEvent(std::chrono::seconds(5));
    REQUIRE(abort.ok());
    CHECK(abort->kind() == v1::Event::KIND_ABORT);
    CHECK(abort->version() == 4);

    // Back again: the agent restarts, the trainer registers anew, the next step re-plans.
    REQUIRE(cluster.StartAgent("trainer-node"));
    Trainer again = Trainer::Open(cluster.socket("trainer-node"));
    again.Fill(5);
    // The agent may need a heartbeat or two to re-register.
    uint64_t version = 5;
    auto next = wb::testing::StepUntilCommitted(ctl, &version);
    INFO((next.ok() ? "" : std::string(next.status().message())));
    REQUIRE(next.ok());
    CHECK(std::memcmp(again.buffer.data(), inference.buffer.data(), again.buffer.size()) == 0);
  }
}

TEST_CASE("step commands go on step links; with links off on either side, on gRPC streams") {
  struct Case {
    const char* name;
    std::string controller_yaml;
    std::string inference_yaml;
    bool trainer_link, inference_link;
  };
  const Case c =
      GENERATE(Case{"links on both sides", "", "", true, true},
               Case{"controller with step_links off", "step_links: false\n", "", false, false},
               Case{"inference agent with step links off", "", "step_link:\n  enabled: false\n",
                    true, false});
  INFO(c.name);
  wb::testing::ClusterOptions options;
  options.extra_controller_yaml = c.controller_yaml;
  if (!c.inference_yaml.empty()) options.agent_yaml["inference-node"] = c.inference_yaml;
  Cluster cluster(wb::testing::Runfile(""), options);
  Trainer trainer = Trainer::Open(cluster.socket("trainer-node"));
  Inference inference = Inference::Open(cluster.socket("inference-node"));
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanOneToOne(&ctl);
  for (uint32_t v = 1; v <= 2; ++v) {
    trainer.Fill(v);
    auto step = ctl.Step(v);
    INFO((step.ok() ? "" : std::string(step.status().message())));
    REQUIRE(step.ok());
    CHECK(SameBytes(trainer, inference));
  }
  // Each agent logs the controller's link when it opens.
  CHECK((cluster.Log("trainer-node").find("step link from") != std::string::npos) ==
        c.trainer_link);
  CHECK((cluster.Log("inference-node").find("step link from") != std::string::npos) ==
        c.inference_link);
  if (c.inference_link) {
    // The link carried the commands, not only opened: the agent counts them when it closes.
    // Step 1 may go on the stream while the link opens; step 2's begin and commit do not.
    cluster.KillAgent("inference-node", SIGTERM);
    REQUIRE(cluster.agent("inference-node")->Wait(std::chrono::seconds(10)) == 0);
    const std::string log = cluster.Log("inference-node");
    std::smatch m;
    REQUIRE(
        std::regex_search(log, m, std::regex("step link from \\S+ closed after (\\d+) command")));
    CHECK(std::stoi(m[1]) >= 2);
  }
  if (!c.inference_yaml.empty()) {
    CHECK_THAT(cluster.Log("controller"),
               Catch::Contains("no step link (OpenStepLink: step links are off"));
  }
}
