// receive.mode staged with real processes (issue 29, "stage, then swap"): the receiving agent
// lands every write in staging memory of its own and swaps it into the live tensors at commit.
// A reader thread samples the live bytes all through slow transfers (the trainer agent holds
// each op) and compares every byte with an expectation computed here: the live tensors hold
// exactly v-1 until the watcher acknowledges begin(v) and exactly v from commit(v) on.
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/controller_calls.h"
#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

constexpr int kTensors = 6;
constexpr int64_t kRows = 64, kCols = 256;
constexpr uint64_t kTensorBytes = kRows * kCols * 2;  // BF16
constexpr uint64_t kBytes = kTensors * kTensorBytes;
constexpr int kHoldMs = 250;  // per op of a held version, on the trainer agent

// Version v's bytes: one byte in 64 depends on v (so delta mode sends patches), every
// such byte differs between v-1 and v; a mix of two versions matches neither.
std::vector<uint8_t> Expected(uint64_t version) {
  std::vector<uint8_t> b(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) {
    b[i] = static_cast<uint8_t>(i * 7 + (i % 64 == 0 ? version * 31 : 0));
  }
  return b;
}

struct Side {
  SharedBuffer buffer;
  LocalSession session;
};

Side Open(const std::string& socket, v1::Role role, int replica) {
  auto b = SharedBuffer::Create(kBytes, "staged-side");
  REQUIRE(b.ok());
  auto s = LocalSession::Connect(socket, Identity{role, 0, replica});
  REQUIRE(s.ok());
  for (int t = 0; t < kTensors; ++t) {
    REQUIRE(s->Register(
                 TensorInfo{
                     "layer." + std::to_string(t) + ".weight", v1::DTYPE_BF16, {kRows, kCols}, {}},
                 *b, t * kTensorBytes, kTensorBytes)
                .ok());
  }
  return Side{std::move(*b), std::move(*s)};
}

void Fill(Side* trainer, uint64_t version) {
  const auto bytes = Expected(version);
  std::memcpy(trainer->buffer.data(), bytes.data(), kBytes);
}

bool Holds(const Side& side, uint64_t version) {
  const auto bytes = Expected(version);
  return std::memcmp(side.buffer.data(), bytes.data(), kBytes) == 0;
}

// Samples a live buffer until stopped. While `before` is set every sample must be exactly
// `old_version`; once `after` is set, exactly `new_version`; counts samples and violations.
struct LiveReader {
  const Side* side;
  std::vector<uint8_t> old_bytes, new_bytes;
  std::atomic<bool> before{true}, after{false}, stop{false};
  std::atomic<int> samples_before{0}, samples_after{0}, bad_before{0}, bad_after{0};
  std::thread thread;

  LiveReader(const Side* s, uint64_t old_version, uint64_t new_version)
      : side(s), old_bytes(Expected(old_version)), new_bytes(Expected(new_version)) {
    thread = std::thread([this] {
      std::vector<uint8_t> sample(kBytes);
      while (!stop) {
        // The phase is read before and after the copy: a sample counts only within one phase.
        const bool b0 = before, a0 = after;
        std::memcpy(sample.data(), side->buffer.data(), kBytes);
        const bool b1 = before, a1 = after;
        if (b0 && b1) {
          ++samples_before;
          if (std::memcmp(sample.data(), old_bytes.data(), kBytes) != 0) ++bad_before;
        } else if (a0 && a1) {
          ++samples_after;
          if (std::memcmp(sample.data(), new_bytes.data(), kBytes) != 0) ++bad_after;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  ~LiveReader() { Stop(); }
  void Stop() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

std::string StagedYaml(const std::string& extra = "") {
  return "receive:\n  mode: staged\n  ack_timeout_ms: 1500\n" + extra;
}

std::string HoldYaml(uint64_t version) {
  return "executor:\n  test_hold_version: " + std::to_string(version) +
         "\n  test_hold_ms: " + std::to_string(kHoldMs) + "\n";
}

// A controller, "trainer-node" and `replicas` staged inference agents "infer-R".
struct Fleet {
  std::unique_ptr<Cluster> cluster;
  std::optional<Side> trainer;
  std::vector<Side> replicas;
  std::optional<ControllerClient> ctl;

  Fleet(int n, const std::string& trainer_yaml, const std::string& controller_yaml = "",
        const std::string& inference_yaml = StagedYaml()) {
    wb::testing::ClusterOptions options;
    options.agents = {"trainer-node"};
    for (int r = 0; r < n; ++r) options.agents.push_back("infer-" + std::to_string(r));
    options.inference_replicas = n;
    options.extra_controller_yaml = controller_yaml;
    options.agent_yaml["trainer-node"] = trainer_yaml;
    for (int r = 0; r < n; ++r) options.agent_yaml["infer-" + std::to_string(r)] = inference_yaml;
    cluster = std::make_unique<Cluster>(wb::testing::Runfile(""), options);
    trainer.emplace(Open(cluster->socket("trainer-node"), v1::ROLE_TRAINER, 0));
    for (int r = 0; r < n; ++r) {
      replicas.push_back(
          Open(cluster->socket("infer-" + std::to_string(r)), v1::ROLE_INFERENCE, r));
    }
    ctl.emplace(wb::testing::ConnectController(*cluster));
  }
};

absl::StatusOr<v1::Event> NextOf(LocalSession& s, v1::Event::Kind kind, uint64_t version,
                                 std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("no such event");
    auto e = s.NextEvent(left);
    if (!e.ok()) return e.status();
    if (e->kind() == kind && e->version() == version) return e;
  }
}

// One held version `v` on a fleet of one replica, watched with ack: the reader sees exactly
// v-1 until this test acknowledges begin(v) (500 ms after it came: the swap waits for it) and
// exactly v from commit(v) on. Returns the step's result and how long it took.
v1::StepResult HeldStep(Fleet& f, uint64_t v, double* step_seconds) {
  Side& inf = f.replicas[0];
  Fill(&*f.trainer, v);
  LiveReader reader(&inf, v - 1, v);
  std::atomic<bool> begin_seen{false};
  std::thread watcher([&] {
    auto begin = NextOf(inf.session, v1::Event::KIND_BEGIN, v, std::chrono::seconds(30));
    if (!begin.ok()) return;
    begin_seen = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the engine pausing
    reader.before = false;
    if (!inf.session.Ack(v).ok()) return;
    if (NextOf(inf.session, v1::Event::KIND_COMMIT, v, std::chrono::seconds(10)).ok()) {
      reader.after = true;
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto result = f.ctl->Step(v);
  *step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  watcher.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // samples after commit
  reader.Stop();
  const v1::StepResult step = wb::testing::RequireCommitted(result);
  INFO("version " << v);
  CHECK(begin_seen);
  CHECK(reader.samples_before > 20);
  CHECK(reader.bad_before == 0);
  CHECK(reader.samples_after > 5);
  CHECK(reader.bad_after == 0);
  CHECK(Holds(inf, v));
  // The swap waited for the acknowledgement: the step took the 500 ms pause at least.
  CHECK(*step_seconds > 0.5);
  return step;
}

}  // namespace

TEST_CASE("staged: live tensors hold v-1 until begin(v) is acknowledged, v after commit(v)") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense"));
  // Versions 2 and 3 are held on the trainer agent (3 only in delta mode: its deltas).
  Fleet f(1, HoldYaml(delta ? 3 : 2),
          delta ? "delta:\n  enabled: true\n  anchor_every: 8\n  verify: true\n" : "");
  wb::testing::PlanWorld(&*f.ctl, wb::testing::World(1, 1, 1));
  Side& inf = f.replicas[0];
  REQUIRE(inf.session.Watch(LocalSession::WatchOptions{true, false, ""}).ok());
  // Version 1 is not held; the watcher acknowledges it at once.
  Fill(&*f.trainer, 1);
  std::thread acker([&] {
    if (NextOf(inf.session, v1::Event::KIND_BEGIN, 1, std::chrono::seconds(30)).ok()) {
      inf.session.Ack(1).IgnoreError();
    }
  });
  wb::testing::RequireCommitted(f.ctl->Step(1));
  acker.join();
  REQUIRE(NextOf(inf.session, v1::Event::KIND_COMMIT, 1, std::chrono::seconds(5)).ok());
  REQUIRE(Holds(inf, 1));
  if (delta) {
    Fill(&*f.trainer, 2);
    std::thread acker2([&] {
      if (NextOf(inf.session, v1::Event::KIND_BEGIN, 2, std::chrono::seconds(30)).ok()) {
        inf.session.Ack(2).IgnoreError();
      }
    });
    wb::testing::RequireCommitted(f.ctl->Step(2));
    acker2.join();
    REQUIRE(Holds(inf, 2));
  }
  const uint64_t v = delta ? 3 : 2;
  double seconds = 0;
  const v1::StepResult step = HeldStep(f, v, &seconds);
  if (delta) CHECK(step.delta_ops() > 0);
  // The pause: per committed replica, the swap (a local copy of 200 KB), not the transfer
  // (kTensors ops held 250 ms each) nor the 500 ms the watcher took to acknowledge.
  REQUIRE(step.replica_pauses_size() == 1);
  CHECK(step.replica_pauses(0).replica() == 0);
  CHECK(step.replica_pauses(0).staged());
  CHECK(step.replica_pauses(0).seconds() < 0.2);
  CHECK(step.inference_pause_seconds() == step.replica_pauses(0).seconds());
  CHECK(seconds > 0.75);  // the acknowledgement's 500 ms and at least one held op
}

TEST_CASE("staged: a watcher that never acknowledges aborts the version, naming it") {
  // Longer than the controller's usual 5 s for a commit: the agent's AgentInfo.commit_wait_ms
  // makes the controller wait for its answer, which names the watcher.
  Fleet f(1, "", "", "receive:\n  mode: staged\n  ack_timeout_ms: 6000\n");
  wb::testing::PlanWorld(&*f.ctl, wb::testing::World(1, 1, 1));
  Side& inf = f.replicas[0];
  Fill(&*f.trainer, 1);
  wb::testing::RequireCommitted(f.ctl->Step(1));  // nobody acknowledges: not waited for
  REQUIRE(Holds(inf, 1));

  // A second session of the replica's process watches with ack and never answers.
  auto silent =
      LocalSession::Connect(f.cluster->socket("infer-0"), Identity{v1::ROLE_INFERENCE, 1, 0});
  REQUIRE(silent.ok());
  REQUIRE(silent->Watch(LocalSession::WatchOptions{true, false, "silent-engine"}).ok());
  REQUIRE(inf.session.Watch().ok());
  Fill(&*f.trainer, 2);
  const auto t0 = std::chrono::steady_clock::now();
  auto step = f.ctl->Step(2);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_FALSE(step.ok());
  CHECK_THAT(std::string(step.status().message()), Catch::Contains("silent-engine"));
  CHECK_THAT(std::string(step.status().message()), Catch::Contains("did not acknowledge"));
  CHECK(seconds > 5.9);  // ack_timeout_ms 6000
  CHECK(seconds < 12);
  CHECK(Holds(inf, 1));  // the live tensors never saw version 2
  auto abort = NextOf(inf.session, v1::Event::KIND_ABORT, 2, std::chrono::seconds(5));
  REQUIRE(abort.ok());
  CHECK_THAT(abort->reason(), Catch::Contains("silent-engine"));

  // Its stream ends: it is no longer waited for, and the next version lands whole.
  silent->Close();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Fill(&*f.trainer, 3);
  wb::testing::RequireCommitted(f.ctl->Step(3));
  CHECK(Holds(inf, 3));
}

TEST_CASE("staged: staging that does not fit the budget refuses the plan, naming the bytes") {
  Fleet f(1, "", "", StagedYaml("  staging_max_bytes: 4096\n"));
  auto plan = f.ctl->Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(20));
  REQUIRE_FALSE(plan.ok());
  const std::string why(plan.status().message());
  CHECK_THAT(why, Catch::Contains("needs at least " + std::to_string(kBytes) + " bytes"));
  CHECK_THAT(why, Catch::Contains("staging_max_bytes is 4096"));
}

TEST_CASE("staged: a receiver killed mid-transfer drops its replica; the other commits") {
  Fleet f(2, HoldYaml(2));
  wb::testing::PlanWorld(&*f.ctl, wb::testing::World(1, 2, 1));
  Fill(&*f.trainer, 1);
  CHECK(wb::testing::RequireCommitted(f.ctl->Step(1)).committed_replicas_size() == 2);
  REQUIRE(f.replicas[1].session.Watch(LocalSession::WatchOptions{true, false, ""}).ok());
  Fill(&*f.trainer, 2);
  LiveReader reader(&f.replicas[1], 1, 2);
  // begin(2) reaches replica 1's watchers only at the swap, which waits for their
  // acknowledgement: until then its live bytes are version 1's.
  std::thread begin_watch([&] {
    if (NextOf(f.replicas[1].session, v1::Event::KIND_BEGIN, 2, std::chrono::seconds(30)).ok()) {
      reader.before = false;
      f.replicas[1].session.Ack(2).IgnoreError();
    }
  });
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(kHoldMs));
    f.cluster->KillAgent("infer-0", SIGKILL);
  });
  auto result = f.ctl->Step(2);
  killer.join();
  begin_watch.join();
  reader.Stop();
  const v1::StepResult step = wb::testing::RequireCommitted(result);
  REQUIRE(step.committed_replicas_size() == 1);
  CHECK(step.committed_replicas(0) == 1);
  REQUIRE(step.skipped_replicas_size() == 1);
  CHECK(step.skipped_replicas(0).replica() == 0);
  CHECK(Holds(f.replicas[1], 2));
  CHECK(reader.samples_before > 20);
  CHECK(reader.bad_before == 0);
  REQUIRE(step.replica_pauses_size() == 1);
  CHECK(step.replica_pauses(0).replica() == 1);
}

TEST_CASE("in place: the pause reported is the whole transfer") {
  Fleet f(1, HoldYaml(2), "", "");
  wb::testing::PlanWorld(&*f.ctl, wb::testing::World(1, 1, 1));
  Fill(&*f.trainer, 1);
  wb::testing::RequireCommitted(f.ctl->Step(1));
  Fill(&*f.trainer, 2);
  const v1::StepResult step = wb::testing::RequireCommitted(f.ctl->Step(2));
  REQUIRE(step.replica_pauses_size() == 1);
  CHECK_FALSE(step.replica_pauses(0).staged());
  CHECK(step.replica_pauses(0).seconds() > 0.2);  // at least one held op
  CHECK(Holds(f.replicas[0], 2));
  // Swap is for staged agents only: a clear refusal.
  auto s = f.replicas[0].session.Watch(LocalSession::WatchOptions{false, true, "swapper"});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("receive.mode staged"));
}

TEST_CASE("staged: a replica spread over two agents swaps at announce, both halves at once") {
  // Replica 0 has two ranks on two agents, each holding three of the six tensors.
  wb::testing::ClusterOptions options;
  options.agents = {"trainer-node", "infer-a", "infer-b"};
  options.inference_ranks_per_replica = 2;
  options.agent_yaml["infer-a"] = StagedYaml();
  options.agent_yaml["infer-b"] = StagedYaml();
  Cluster cluster(wb::testing::Runfile(""), options);
  Side trainer = Open(cluster.socket("trainer-node"), v1::ROLE_TRAINER, 0);
  std::vector<Side> halves;
  for (int rank = 0; rank < 2; ++rank) {
    auto b = SharedBuffer::Create(kBytes, "staged-half");
    REQUIRE(b.ok());
    auto s = LocalSession::Connect(cluster.socket(rank == 0 ? "infer-a" : "infer-b"),
                                   Identity{v1::ROLE_INFERENCE, rank, 0});
    REQUIRE(s.ok());
    for (int t = rank * 3; t < rank * 3 + 3; ++t) {
      REQUIRE(
          s->Register(
               TensorInfo{
                   "layer." + std::to_string(t) + ".weight", v1::DTYPE_BF16, {kRows, kCols}, {}},
               *b, t * kTensorBytes, kTensorBytes)
              .ok());
    }
    REQUIRE(s->Watch().ok());
    halves.push_back(Side{std::move(*b), std::move(*s)});
  }
  auto ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanWorld(&ctl, wb::testing::World(1, 1, 2));
  for (uint64_t v = 1; v <= 2; ++v) {
    Fill(&trainer, v);
    const v1::StepResult step = wb::testing::RequireCommitted(ctl.Step(v));
    const auto expected = Expected(v);
    for (int rank = 0; rank < 2; ++rank) {
      INFO("version " << v << " rank " << rank);
      const auto* live = static_cast<const uint8_t*>(halves[rank].buffer.data());
      CHECK(std::memcmp(live + rank * 3 * kTensorBytes, expected.data() + rank * 3 * kTensorBytes,
                        3 * kTensorBytes) == 0);
      // begin(v) only at the announce, then commit(v).
      auto begin = halves[rank].session.NextEvent(std::chrono::seconds(5));
      REQUIRE(begin.ok());
      CHECK(begin->kind() == v1::Event::KIND_BEGIN);
      CHECK(begin->version() == v);
      CHECK(NextOf(halves[rank].session, v1::Event::KIND_COMMIT, v, std::chrono::seconds(5)).ok());
    }
    REQUIRE(step.replica_pauses_size() == 1);
    CHECK(step.replica_pauses(0).staged());
  }
}
