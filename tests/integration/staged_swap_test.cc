// The staged swap under a hostile local user and unlucky timing (issue 41, items 2, 3, 4 and 9),
// with real processes: a controller, a trainer agent and one staged inference agent.
//   - a destination (or the agent's staging object) shrunk under the agent fails that version,
//     never the agent (the swap and the restore copy inside the SIGBUS guard);
//   - another user's swap watcher does not turn off the agent's swap of this user's tensors;
//   - another user's silent watcher, or one squatting on this user's watcher name, neither
//     stalls nor refuses this user's swap;
//   - an abort that meets the swap's copy (receive.test_swap_delay_ms) never reaches the
//     watchers after commit(v), and live bytes after an abort(v) are v-1's.
// Other users' watchers run as "nobody" (tests/support/watch_as); without root, those cases
// print SKIPPED.
#include <fcntl.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
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
#include "tests/support/process.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;
using wb::testing::Process;

namespace {

constexpr int kTensors = 4;
constexpr int64_t kRows = 64, kCols = 256;
constexpr uint64_t kTensorBytes = kRows * kCols * 2;  // BF16
constexpr uint64_t kBytes = kTensors * kTensorBytes;

std::vector<uint8_t> Expected(uint64_t version) {
  std::vector<uint8_t> b(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) b[i] = static_cast<uint8_t>(i * 7 + version * 31);
  return b;
}

struct Side {
  SharedBuffer buffer;
  LocalSession session;
};

Side Open(const std::string& socket, v1::Role role) {
  auto b = SharedBuffer::Create(kBytes, "swap-side");
  REQUIRE(b.ok());
  auto s = LocalSession::Connect(socket, Identity{role, 0, 0});
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

bool Holds(const Side& side, uint64_t version) {
  const auto bytes = Expected(version);
  return std::memcmp(side.buffer.data(), bytes.data(), kBytes) == 0;
}

// A controller, "trainer-node" and one staged inference agent "infer-0" whose socket any
// local user may open (socket_mode 0666, its directory searchable).
struct Fleet {
  std::unique_ptr<Cluster> cluster;
  std::optional<Side> trainer, inference;
  std::optional<ControllerClient> ctl;

  explicit Fleet(const std::string& inference_yaml) {
    wb::testing::ClusterOptions options;
    options.agents = {"trainer-node", "infer-0"};
    options.inference_replicas = 1;
    options.agent_yaml["infer-0"] = "socket_mode: 0666\n" + inference_yaml;
    cluster = std::make_unique<Cluster>(wb::testing::Runfile(""), options);
    chmod(cluster->dir().c_str(), 0755);
    trainer.emplace(Open(cluster->socket("trainer-node"), v1::ROLE_TRAINER));
    inference.emplace(Open(cluster->socket("infer-0"), v1::ROLE_INFERENCE));
    ctl.emplace(wb::testing::ConnectController(*cluster));
    wb::testing::PlanWorld(&*ctl, wb::testing::World(1, 1, 1));
  }
  void Fill(uint64_t version) {
    const auto bytes = Expected(version);
    std::memcpy(trainer->buffer.data(), bytes.data(), kBytes);
  }
  bool AgentAlive() { return cluster->agent("infer-0")->running(); }
};

std::string StagedYaml(const std::string& extra = "") {
  return "receive:\n  mode: staged\n  ack_timeout_ms: 1500\n" + extra;
}

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

// A watcher of user "nobody" on `fleet`'s inference agent (tests/support/watch_as, copied
// where nobody may run it). Returns null (SKIPPED) without root.
std::unique_ptr<Process> WatchAsNobody(Fleet& f, const std::vector<std::string>& flags) {
  passwd* nobody = getpwnam("nobody");
  if (geteuid() != 0 || nobody == nullptr) return nullptr;
  const std::string bin = f.cluster->dir() + "/watch_as";
  if (access(bin.c_str(), X_OK) != 0) {
    std::filesystem::copy_file(wb::testing::Runfile("tests/support/watch_as"), bin);
    chmod(bin.c_str(), 0755);
  }
  std::vector<std::string> argv = {bin,
                                   "--socket",
                                   f.cluster->socket("infer-0"),
                                   "--uid",
                                   std::to_string(nobody->pw_uid),
                                   "--gid",
                                   std::to_string(nobody->pw_gid)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const std::string log = f.cluster->dir() + "/watch_as-" + std::to_string(rand()) + ".log";
  auto p = std::make_unique<Process>(argv, log);
  REQUIRE(wb::testing::WaitUntil(
      [&] { return wb::testing::ReadFile(log).find("watching") != std::string::npos; },
      std::chrono::seconds(10)));
  return p;
}

// Acknowledges begin(v) on `side` as soon as it comes (the engine pausing at once).
std::thread AckBegin(Side& side, uint64_t v) {
  return std::thread([&side, v] {
    if (NextOf(side.session, v1::Event::KIND_BEGIN, v, std::chrono::seconds(30)).ok()) {
      side.session.Ack(v).IgnoreError();
    }
  });
}

}  // namespace

TEST_CASE("staged: a destination or staging object shrunk under the agent fails the version") {
  Fleet f(StagedYaml());
  Side& inf = *f.inference;
  REQUIRE(inf.session.Watch().ok());
  f.Fill(1);
  wb::testing::RequireCommitted(f.ctl->Step(1));
  REQUIRE(Holds(inf, 1));

  // The inference process shrinks its own destination object: the swap of version 2 meets it.
  const int fd = shm_open(inf.buffer.shm_name().c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 0) == 0);
  f.Fill(2);
  auto step2 = f.ctl->Step(2);
  CHECK_FALSE(step2.ok());
  REQUIRE(f.AgentAlive());
  auto abort = NextOf(inf.session, v1::Event::KIND_ABORT, 2, std::chrono::seconds(10));
  REQUIRE(abort.ok());
  INFO(abort->reason());
  CHECK_THAT(abort->reason(), Catch::Contains("layer.") && Catch::Contains("shrunk"));

  // Its size back, the next version lands whole.
  REQUIRE(ftruncate(fd, kBytes) == 0);
  close(fd);
  f.Fill(3);
  wb::testing::RequireCommitted(f.ctl->Step(3));
  CHECK(Holds(inf, 3));
  REQUIRE(f.AgentAlive());

  // The agent's own staging object shrunk (by a process allowed to): versions may fail, the
  // agent lives (the restore before each step and the swap copy inside the guard).
  const std::string prefix =
      "wb-staging-" + std::to_string(f.cluster->agent("infer-0")->pid()) + "-";
  int shrunk = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const int s = shm_open(("/" + name).c_str(), O_RDWR, 0);
    REQUIRE(s >= 0);
    REQUIRE(ftruncate(s, 0) == 0);
    close(s);
    ++shrunk;
  }
  REQUIRE(shrunk > 0);
  for (uint64_t v = 4; v <= 5; ++v) {
    f.Fill(v);
    (void)f.ctl->Step(v);
    REQUIRE(f.AgentAlive());
  }
}

TEST_CASE("staged: another user's swap watcher does not turn off the agent's swap") {
  Fleet f(StagedYaml());
  Side& inf = *f.inference;
  REQUIRE(inf.session.Watch().ok());
  f.Fill(1);
  wb::testing::RequireCommitted(f.ctl->Step(1));
  REQUIRE(Holds(inf, 1));
  // "nobody" owns no tensor here; its swap watcher answers every ready(v) at once.
  auto rogue = WatchAsNobody(f, {"--swap", "--watcher", "rogue", "--answer"});
  if (!rogue) {
    WARN("SKIPPED: running a watcher as another user needs root");
    return;
  }
  for (uint64_t v = 2; v <= 3; ++v) {
    INFO("version " << v);
    f.Fill(v);
    wb::testing::RequireCommitted(f.ctl->Step(v));
    REQUIRE(NextOf(inf.session, v1::Event::KIND_COMMIT, v, std::chrono::seconds(5)).ok());
    // commit(v) means these bytes: the agent swapped this user's tensors itself.
    CHECK(Holds(inf, v));
  }
  // It never heard of this user's staging objects either.
  CHECK_THAT(wb::testing::ReadFile(f.cluster->dir() + "/infer-0.log"),
             !Catch::Contains("by swap watchers") || Catch::Contains("0 by swap watchers"));
}

TEST_CASE("staged: another user's silent or squatting watcher neither stalls nor refuses a swap") {
  Fleet f(StagedYaml());
  Side& inf = *f.inference;
  // This user's engine watches as "engine" and acknowledges each begin(v).
  f.Fill(1);
  wb::testing::RequireCommitted(f.ctl->Step(1));
  // "nobody" takes this user's watcher name first, and opens a second, silent ack watcher.
  auto squatter = WatchAsNobody(f, {"--ack", "--watcher", "engine"});
  if (!squatter) {
    WARN("SKIPPED: running a watcher as another user needs root");
    return;
  }
  auto silent = WatchAsNobody(f, {"--ack", "--watcher", "silent"});
  REQUIRE(inf.session.Watch(LocalSession::WatchOptions{true, false, "engine"}).ok());
  for (uint64_t v = 2; v <= 3; ++v) {
    INFO("version " << v);
    f.Fill(v);
    std::thread acker = AckBegin(inf, v);
    const auto t0 = std::chrono::steady_clock::now();
    auto step = f.ctl->Step(v);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    acker.join();
    if (!step.ok()) INFO(step.status().ToString());
    wb::testing::RequireCommitted(step);
    CHECK(seconds < 1.4);  // never the 1.5 s ack timeout for the silent watchers
    CHECK(Holds(inf, v));
  }
}

TEST_CASE("staged: an abort meeting the swap's copy is never told with commit(v)") {
  // Version 2's copy is held 8 s after the (absent) watchers answered: the controller's commit
  // call (5 s + ack_timeout_ms) gives up and aborts the step on the agent mid-copy.
  Fleet f(StagedYaml("  test_swap_delay_version: 2\n  test_swap_delay_ms: 8000\n"));
  Side& inf = *f.inference;
  REQUIRE(inf.session.Watch().ok());
  f.Fill(1);
  wb::testing::RequireCommitted(f.ctl->Step(1));
  REQUIRE(Holds(inf, 1));
  f.Fill(2);
  auto step2 = f.ctl->Step(2);
  std::vector<v1::Event> events;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    auto e = inf.session.NextEvent(std::chrono::milliseconds(500));
    if (e.ok() && e->version() == 2) events.push_back(*e);
  }
  int commit_at = -1, abort_at = -1;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].kind() == v1::Event::KIND_COMMIT && commit_at < 0) commit_at = int(i);
    if (events[i].kind() == v1::Event::KIND_ABORT && abort_at < 0) abort_at = int(i);
  }
  INFO("step 2: " << (step2.ok() ? "committed" : step2.status().ToString()));
  INFO("commit(2) at " << commit_at << ", abort(2) at " << abort_at << " of " << events.size()
                       << " events of version 2");
  // Never both: abort(2) then commit(2) tells the watchers a withdrawn version went live.
  CHECK_FALSE((commit_at >= 0 && abort_at >= 0));
  CHECK((commit_at >= 0 || abort_at >= 0));
  REQUIRE(f.AgentAlive());
  if (commit_at >= 0) CHECK(Holds(inf, 2));
  if (abort_at >= 0) CHECK(Holds(inf, 1));  // live bytes after abort(2): all version 1's
  // The controller agrees with the agent: a version that went live there (the abort met the
  // copy and waited for it) is committed to that replica, not counted as skipped.
  if (commit_at >= 0) {
    REQUIRE(step2.ok());
    CHECK(step2->ok());
    CHECK(step2->committed_replicas_size() == 1);
    CHECK(step2->skipped_replicas_size() == 0);
  }
  // The next step is neither torn by nor refused for the held swap.
  f.Fill(3);
  std::thread acker = AckBegin(inf, 3);
  auto step3 = f.ctl->Step(3);
  acker.join();
  wb::testing::RequireCommitted(step3);
  CHECK(Holds(inf, 3));
}
