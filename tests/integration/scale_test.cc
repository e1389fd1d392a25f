// Scale and stall behaviour against real processes (a controller and two agents on loopback):
// 10^5 tiny tensors registered through one Local session in batches, listed by the controller,
// planned and stepped; a watcher that is told when its subscription is in place; a receiver
// frozen at begin failing the step by name within the step timeout.
// (10^6 tensors run in tests/bench/register_bench; 10^5 keeps this test to ~1 minute.)
#include <dirent.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Registers tensors "t.<i>" (i in [0, n)), 2 BF16 elements each at offset 4 i, in batches.
absl::Status RegisterMany(LocalSession& s, const SharedBuffer& buf, int n, int batch) {
  std::vector<BufferSlice> slices;
  for (int i = 0; i < n; i += batch) {
    slices.clear();
    for (int k = i; k < std::min(n, i + batch); ++k) {
      slices.push_back(
          {TensorInfo{"t." + std::to_string(k), v1::DTYPE_BF16, {2}, {}}, 4ull * k, 4});
    }
    if (auto st = s.RegisterBatch(slices, buf); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// One tiny tensor "w" per side, for the step tests.
struct Pair {
  SharedBuffer src, dst;
  LocalSession trainer, inference;
};

Pair OpenPair(const Cluster& cluster) {
  auto src = SharedBuffer::Create(4096, "src");
  auto dst = SharedBuffer::Create(4096, "dst");
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  auto t = LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
  auto i = LocalSession::Connect(cluster.socket("inference-node"), {v1::ROLE_INFERENCE, 0, 0});
  REQUIRE(t.ok());
  REQUIRE(i.ok());
  TensorInfo w{"w", v1::DTYPE_BF16, {2048}, {}};
  REQUIRE(t->Register(w, *src, 0, 4096).ok());
  REQUIRE(i->Register(w, *dst, 0, 4096).ok());
  return Pair{std::move(*src), std::move(*dst), std::move(*t), std::move(*i)};
}

// SIGSTOP is delivered asynchronously: wait until every thread of `pid` is stopped ('T' in
// /proc/PID/task/*/stat), so the next call really meets a frozen process.
bool FrozenNow(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool all = true;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string stat = wb::testing::ReadFile(dir + "/" + e->d_name + "/stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) continue;
    if (stat[close + 2] != 'T' && stat[close + 2] != 't') all = false;
  }
  closedir(d);
  return all;
}

void Freeze(Cluster& cluster, const std::string& agent) {
  cluster.KillAgent(agent, SIGSTOP);
  REQUIRE(wb::testing::WaitUntil([&] { return FrozenNow(cluster.agent(agent)->pid()); },
                                 std::chrono::seconds(10)));
}

}  // namespace

TEST_CASE("10^5 tiny tensors through one session: listed, planned, stepped, withdrawn") {
  constexpr int kTensors = 100000, kBatch = 1000;
  wb::testing::ClusterOptions options;
  // Liveness is not under test here: on a busy 2-core machine a 1.5 s timeout can lose an
  // agent while 10^5-tensor layouts are in flight.
  options.heartbeat_timeout_ms = 15000;
  Cluster cluster(wb::testing::Runfile(""), options);
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  auto src = SharedBuffer::Create(4ull * kTensors, "many-src");
  auto dst = SharedBuffer::Create(4ull * kTensors, "many-dst");
  REQUIRE(src.ok());
  REQUIRE(dst.ok());
  auto* p = static_cast<uint16_t*>(src->data());
  for (int i = 0; i < 2 * kTensors; ++i) p[i] = static_cast<uint16_t>(0x3c00 + (i & 0x3ff));
  auto trainer =
      LocalSession::Connect(cluster.socket("trainer-node"), Identity{v1::ROLE_TRAINER, 0, 0});
  auto inference =
      LocalSession::Connect(cluster.socket("inference-node"), Identity{v1::ROLE_INFERENCE, 0, 0});
  REQUIRE(trainer.ok());
  REQUIRE(inference.ok());

  auto r = RegisterMany(*trainer, *src, kTensors, kBatch);
  INFO(Message(r));
  REQUIRE(r.ok());
  r = RegisterMany(*inference, *dst, kTensors, kBatch);
  INFO(Message(r));
  REQUIRE(r.ok());

  // Reports are coalesced; the controller catches up with the last batch.
  REQUIRE(wb::testing::WaitUntil([&] { return wb::testing::StatusTensors(ctl) == 2 * kTensors; },
                                 std::chrono::seconds(120)));
  CHECK(wb::testing::ListedTensors(ctl, "trainer-node") == kTensors);
  CHECK(wb::testing::ListedTensors(ctl, "inference-node") == kTensors);

  // A duplicate in a batch refuses the whole batch, naming the tensor; nothing stays.
  std::vector<BufferSlice> dup = {
      {TensorInfo{"fresh.0", v1::DTYPE_BF16, {2}, {}}, 0, 4},
      {TensorInfo{"t.54321", v1::DTYPE_BF16, {2}, {}}, 4, 4},
  };
  auto refused = trainer->RegisterBatch(dup, *src);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(Message(refused),
             Catch::Contains("tensor 't.54321' is already registered by trainer rank 0"));

  auto plan = ctl.Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(60));
  INFO((plan.ok() ? "" : Message(plan.status())));
  REQUIRE(plan.ok());
  CHECK(plan->total_ops() == kTensors);
  auto step = ctl.Step(1, std::chrono::seconds(120));
  INFO((step.ok() ? "" : Message(step.status())));
  REQUIRE(step.ok());
  CHECK(std::memcmp(src->data(), dst->data(), 4ull * kTensors) == 0);

  // Closing the session withdraws all of them; the daemons keep serving.
  trainer->Close();
  REQUIRE(
      wb::testing::WaitUntil([&] { return wb::testing::ListedTensors(ctl, "trainer-node") == 0; },
                             std::chrono::seconds(60)));
  auto again =
      LocalSession::Connect(cluster.socket("trainer-node"), Identity{v1::ROLE_TRAINER, 0, 0});
  REQUIRE(again.ok());
  CHECK(again->Register(TensorInfo{"t.1", v1::DTYPE_BF16, {2}, {}}, *src, 4, 4).ok());
  CHECK(wb::testing::WaitUntil([&] { return wb::testing::ListedTensors(ctl, "trainer-node") == 1; },
                               std::chrono::seconds(10)));
}

TEST_CASE("Watch() returns once subscribed: the very next step's begin and commit arrive") {
  Cluster cluster(wb::testing::Runfile(""), {});
  Pair pair = OpenPair(cluster);
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  REQUIRE(ctl.Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(20)).ok());
  for (uint64_t version = 1; version <= 3; ++version) {
    // A fresh watcher each time, stepping right after Watch() returns: no sleep needed.
    auto watcher =
        LocalSession::Connect(cluster.socket("inference-node"), Identity{v1::ROLE_INFERENCE, 0, 1});
    REQUIRE(watcher.ok());
    REQUIRE(watcher->Watch().ok());
    CHECK(watcher->watch_start_version() == version - 1);  // the committed version
    auto step = ctl.Step(version);
    INFO((step.ok() ? "" : Message(step.status())));
    REQUIRE(step.ok());
    auto begin = watcher->NextEvent(std::chrono::seconds(10));
    REQUIRE(begin.ok());
    CHECK(begin->kind() == v1::Event::KIND_BEGIN);
    CHECK(begin->version() == version);
    auto commit = watcher->NextEvent(std::chrono::seconds(10));
    REQUIRE(commit.ok());
    CHECK(commit->kind() == v1::Event::KIND_COMMIT);
    CHECK(commit->version() == version);
  }
}

TEST_CASE("a receiver frozen at begin fails the step by name within the step timeout") {
  wb::testing::ClusterOptions options;
  options.heartbeat_timeout_ms = 60000;  // frozen, not lost: the step itself must notice
  Cluster cluster(wb::testing::Runfile(""), options);
  Pair pair = OpenPair(cluster);
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  REQUIRE(ctl.Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(20)).ok());
  REQUIRE(ctl.Step(1).ok());

  Freeze(cluster, "inference-node");
  auto stalled = ctl.Step(2, std::chrono::milliseconds(2000));
  cluster.KillAgent("inference-node", SIGCONT);
  REQUIRE_FALSE(stalled.ok());
  CHECK_THAT(Message(stalled.status()),
             Catch::Contains("agent inference-node: begin failed: no answer before the deadline"));
  auto status = ctl.Status();
  REQUIRE(status.ok());
  REQUIRE(status->recent_steps_size() > 0);
  const auto& failed = status->recent_steps(status->recent_steps_size() - 1);
  CHECK(failed.version() == 2);
  CHECK_FALSE(failed.ok());
  CHECK(failed.seconds() < 15.0);  // the 2 s step timeout, not the 60 s default (generous)

  // Thawed, the next step commits.
  uint64_t version = 3;
  wb::testing::RequireCommitted(wb::testing::StepUntilCommitted(ctl, &version, 20));
}

TEST_CASE("SIGTERM to the controller mid-step aborts the step on its agents at once") {
  wb::testing::ClusterOptions options;
  options.heartbeat_timeout_ms = 60000;
  Cluster cluster(wb::testing::Runfile(""), options);
  Pair pair = OpenPair(cluster);
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  REQUIRE(ctl.Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(20)).ok());
  REQUIRE(ctl.Step(1).ok());
  REQUIRE(pair.inference.Watch().ok());

  // A frozen sender keeps step 2 in flight until something aborts it.
  Freeze(cluster, "trainer-node");
  std::thread stepper([&] { (void)ctl.Step(2, std::chrono::seconds(30)); });
  auto begin = pair.inference.NextEvent(std::chrono::seconds(10));
  REQUIRE(begin.ok());
  CHECK(begin->kind() == v1::Event::KIND_BEGIN);
  cluster.RestartController(SIGTERM);
  auto abort = pair.inference.NextEvent(std::chrono::seconds(10));
  cluster.KillAgent("trainer-node", SIGCONT);
  stepper.join();
  REQUIRE(abort.ok());
  CHECK(abort->kind() == v1::Event::KIND_ABORT);
  CHECK(abort->version() == 2);
  CHECK_THAT(abort->reason(), Catch::Contains("controller shutting down (signal 15)"));

  // The restarted controller re-plans and the next step commits.
  ControllerClient ctl2 = wb::testing::ConnectController(cluster);
  uint64_t version = 3;
  wb::testing::RequireCommitted(wb::testing::StepUntilCommitted(ctl2, &version));
}

TEST_CASE("a frozen agent makes a session call fail after the call timeout, not hang") {
  wb::testing::ClusterOptions options;
  options.heartbeat_timeout_ms = 60000;
  Cluster cluster(wb::testing::Runfile(""), options);
  auto buf = SharedBuffer::Create(4096, "frozen");
  REQUIRE(buf.ok());
  auto s = LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
  REQUIRE(s.ok());
  s->SetCallTimeout(std::chrono::milliseconds(1000));
  REQUIRE(s->Register(TensorInfo{"a", v1::DTYPE_BF16, {2}, {}}, *buf, 0, 4).ok());

  Freeze(cluster, "trainer-node");
  auto r = s->Register(TensorInfo{"b", v1::DTYPE_BF16, {2}, {}}, *buf, 4, 4);
  cluster.KillAgent("trainer-node", SIGCONT);
  REQUIRE_FALSE(r.ok());
  CHECK(r.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(Message(r), Catch::Contains("did not answer within 1000 ms; the session is closed"));
  // The session is closed; the agent (thawed) withdraws its tensors and serves a new one.
  CHECK_THAT(Message(s->Register(TensorInfo{"c", v1::DTYPE_BF16, {2}, {}}, *buf, 8, 4)),
             Catch::Contains("the session is closed"));
  auto again = LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
  REQUIRE(again.ok());
  // "a" is free again once the thawed agent has seen the old session end.
  CHECK(wb::testing::WaitUntil(
      [&] {
        return again->Register(TensorInfo{"a", v1::DTYPE_BF16, {2}, {}}, *buf, 0, 4).ok();
      },
      std::chrono::seconds(10)));
}
