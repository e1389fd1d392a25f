// Faults and bad input against real processes (a controller and two agents on loopback): a
// frozen agent, a crashing trainer, an exiting inference process, and malformed registrations
// and steps. Each fault gives a prompt, named error; the next step after the fault commits.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;
using wb::testing::ListedTensors;
using wb::testing::StepUntilCommitted;

namespace {

constexpr int64_t kRows = 512, kCols = 1024;
constexpr uint64_t kTensorBytes = kRows * kCols * 2;  // one BF16 tensor
constexpr uint64_t kSideBytes = 2 * kTensorBytes;     // a.weight and b.weight

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Registers a.weight and b.weight of `buffer` with a new session on `socket`.
absl::StatusOr<LocalSession> RegisterSide(const std::string& socket, v1::Role role,
                                          const SharedBuffer& buffer) {
  auto s = LocalSession::Connect(socket, Identity{role, 0, 0});
  if (!s.ok()) return s.status();
  for (int i = 0; i < 2; ++i) {
    TensorInfo t{i == 0 ? "a.weight" : "b.weight", v1::DTYPE_BF16, {kRows, kCols}, {}};
    absl::Status r = s->Register(t, buffer, i * kTensorBytes, kTensorBytes);
    if (!r.ok()) return r;
  }
  return s;
}

void Fill(const SharedBuffer& b, uint32_t version) {
  auto* p = static_cast<uint16_t*>(b.data());
  for (uint64_t i = 0; i < b.size() / 2; ++i) {
    p[i] = static_cast<uint16_t>(0x3c00 + ((i * 7 + version * 13) & 0x3ff));
  }
}

bool AllBytesAre(const SharedBuffer& b, uint8_t value) {
  const auto* p = static_cast<const uint8_t*>(b.data());
  for (size_t i = 0; i < b.size(); ++i) {
    if (p[i] != value) return false;
  }
  return true;
}

bool SameBytes(const SharedBuffer& a, const SharedBuffer& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// A registered side held in this process.
struct Side {
  SharedBuffer buffer;
  LocalSession session;
  static Side Open(const std::string& socket, v1::Role role) {
    auto b = SharedBuffer::Create(kSideBytes, "side");
    REQUIRE(b.ok());
    auto s = RegisterSide(socket, role, *b);
    INFO((s.ok() ? "" : Message(s.status())));
    REQUIRE(s.ok());
    return Side{std::move(*b), std::move(*s)};
  }
};

// A buffer made here, registered with `socket` by a child process (which inherits it over fork)
// that then waits to be killed; the buffer stays mapped here after the child dies.
struct ChildSide {
  SharedBuffer buffer;
  pid_t pid;
};

// Returns once the child has registered.
ChildSide RegisterInChild(const std::string& socket, v1::Role role, const std::string& name,
                          uint32_t fill_version) {
  auto made = SharedBuffer::Create(kSideBytes, name);
  REQUIRE(made.ok());
  const SharedBuffer& buffer = *made;
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(ready[0]);
    if (fill_version != 0) Fill(buffer, fill_version);
    auto s = RegisterSide(socket, role, buffer);
    char c = s.ok() ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    pause();
    _exit(0);  // no destructors: the buffer belongs to the parent
  }
  close(ready[1]);
  char c = 0;
  REQUIRE(read(ready[0], &c, 1) == 1);
  close(ready[0]);
  REQUIRE(c == 'y');
  return ChildSide{std::move(*made), child};
}

void KillChild(pid_t child) {
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

// Kills the registering child and waits until the controller lists none of `agent`'s tensors.
void KillAndAwaitWithdrawal(pid_t child, ControllerClient& ctl, const std::string& agent) {
  KillChild(child);
  REQUIRE(wb::testing::WaitUntil([&] { return ListedTensors(ctl, agent) == 0; },
                                 std::chrono::seconds(10)));
}

// Steps from `*version` on (one version per try) until one commits or `tries` run out.
// Fills `trainer` for `version` and steps from that version on until a step commits (agents may
// still be coming back); `inference` then holds the same bytes.
void CommitsAgain(ControllerClient& ctl, const SharedBuffer& trainer, const SharedBuffer& inference,
                  uint64_t version) {
  Fill(trainer, version);
  wb::testing::RequireCommitted(StepUntilCommitted(ctl, &version));
  CHECK(SameBytes(trainer, inference));
}

ControllerClient ConnectAndPlan(const Cluster& cluster) {
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanOneToOne(&ctl);
  return ctl;
}

// ConnectAndPlan, then fills `trainer` for version 1, which must commit: `inference` then holds
// the same bytes.
ControllerClient FirstStepCommits(const Cluster& cluster, const SharedBuffer& trainer,
                                  const SharedBuffer& inference) {
  ControllerClient ctl = ConnectAndPlan(cluster);
  Fill(trainer, 1);
  wb::testing::RequireCommitted(ctl.Step(1));
  REQUIRE(SameBytes(trainer, inference));
  return ctl;
}

// Runs step `version` with a 15 s timeout and CHECKs that it was decided in under 5 s (from
// membership or the plan, not by waiting the timeout out); returns its status.
absl::Status StepDecidedFast(ControllerClient& ctl, uint64_t version) {
  const auto t0 = std::chrono::steady_clock::now();
  auto step = ctl.Step(version, std::chrono::seconds(15));
  CHECK(SecondsSince(t0) < 5);
  return step.status();
}

}  // namespace

TEST_CASE("a frozen agent is reported lost by name; after SIGCONT the next step commits") {
  Cluster cluster(wb::testing::Runfile(""), {});
  Side trainer = Side::Open(cluster.socket("trainer-node"), v1::ROLE_TRAINER);
  Side inference = Side::Open(cluster.socket("inference-node"), v1::ROLE_INFERENCE);
  ControllerClient ctl = FirstStepCommits(cluster, trainer.buffer, inference.buffer);

  cluster.KillAgent("inference-node", SIGSTOP);
  // Past the 1500 ms heartbeat timeout.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  Fill(trainer.buffer, 2);
  const absl::Status step = StepDecidedFast(ctl, 2);  // from membership
  cluster.KillAgent("inference-node", SIGCONT);
  REQUIRE_FALSE(step.ok());
  CHECK_THAT(Message(step), Catch::Contains("inference-node") && Catch::Contains("lost"));

  CommitsAgain(ctl, trainer.buffer, inference.buffer, 3);
}

// Lines of `log` that contain `what`.
int LinesWith(const std::string& log, const std::string& what) {
  int n = 0;
  for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("a heartbeat left unanswered is retried; the agents do not register their layout again") {
  wb::testing::ClusterOptions options;
  options.heartbeat_timeout_ms = 15000;  // the frozen controller does not take them for lost
  Cluster cluster(wb::testing::Runfile(""), options);
  Side trainer = Side::Open(cluster.socket("trainer-node"), v1::ROLE_TRAINER);
  Side inference = Side::Open(cluster.socket("inference-node"), v1::ROLE_INFERENCE);
  ControllerClient ctl = FirstStepCommits(cluster, trainer.buffer, inference.buffer);

  // A heartbeat waits 2 s for its answer: a controller frozen for 3 s leaves one unanswered.
  cluster.controller()->Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  cluster.controller()->Signal(SIGCONT);
  for (const char* agent : {"trainer-node", "inference-node"}) {
    REQUIRE(wb::testing::WaitUntil(
        [&] { return LinesWith(cluster.Log(agent), "unreachable: Deadline Exceeded") > 0; },
        std::chrono::seconds(10)));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // heartbeats answered again
  for (const char* agent : {"trainer-node", "inference-node"}) {
    INFO(agent);
    CHECK(LinesWith(cluster.Log(agent), "registered with controller") == 1);
  }
  const std::string controller = cluster.Log("controller");
  CHECK(LinesWith(controller, " registered from ") + LinesWith(controller, "registered again") ==
        2);
  CommitsAgain(ctl, trainer.buffer, inference.buffer, 2);
}

TEST_CASE("a trainer process killed loses its source; the next step cannot plan; a new one works") {
  Cluster cluster(wb::testing::Runfile(""), {});
  // The trainer's buffer is made here so the test can compare bytes; the child registers it.
  ChildSide source = RegisterInChild(cluster.socket("trainer-node"), v1::ROLE_TRAINER, "src", 1);
  Side inference = Side::Open(cluster.socket("inference-node"), v1::ROLE_INFERENCE);
  ControllerClient ctl =
      FirstStepCommits(cluster, source.buffer, inference.buffer);  // the child filled the same

  KillAndAwaitWithdrawal(source.pid, ctl, "trainer-node");
  const absl::Status lost = StepDecidedFast(ctl, 2);
  REQUIRE_FALSE(lost.ok());
  CHECK_THAT(Message(lost),
             Catch::Contains("cannot plan") && Catch::Contains("missing: trainer rank 0"));

  Side trainer = Side::Open(cluster.socket("trainer-node"), v1::ROLE_TRAINER);
  CommitsAgain(ctl, trainer.buffer, inference.buffer, 3);
}

TEST_CASE("an exited inference process's memory is never written after its regions go") {
  Cluster cluster(wb::testing::Runfile(""), {});
  // The destination is mapped here and stays mapped after the registering child dies.
  ChildSide dest = RegisterInChild(cluster.socket("inference-node"), v1::ROLE_INFERENCE, "dst", 0);
  Side trainer = Side::Open(cluster.socket("trainer-node"), v1::ROLE_TRAINER);
  ControllerClient ctl =
      FirstStepCommits(cluster, trainer.buffer, dest.buffer);  // the child's registration was live

  std::memset(dest.buffer.data(), 0xA5, dest.buffer.size());
  KillAndAwaitWithdrawal(dest.pid, ctl, "inference-node");
  for (uint64_t v = 2; v <= 4; ++v) {
    Fill(trainer.buffer, v);
    auto step = ctl.Step(v, std::chrono::seconds(15));
    INFO("step " << v << ": " << (step.ok() ? "committed" : Message(step.status())));
    if (step.ok()) CHECK(step->bytes() == 0);  // nothing may be sent to a withdrawn region
    CHECK(AllBytesAre(dest.buffer, 0xA5));
  }

  Side inference = Side::Open(cluster.socket("inference-node"), v1::ROLE_INFERENCE);
  CommitsAgain(ctl, trainer.buffer, inference.buffer, 5);
  CHECK(AllBytesAre(dest.buffer, 0xA5));
}

TEST_CASE("malformed registrations and steps are refused by name; the daemons keep serving") {
  Cluster cluster(wb::testing::Runfile(""), {});
  Side trainer = Side::Open(cluster.socket("trainer-node"), v1::ROLE_TRAINER);
  Side inference = Side::Open(cluster.socket("inference-node"), v1::ROLE_INFERENCE);
  ControllerClient ctl = ConnectAndPlan(cluster);
  auto scratch = SharedBuffer::Create(1 << 20, "bad");
  REQUIRE(scratch.ok());
  auto bad =
      LocalSession::Connect(cluster.socket("inference-node"), Identity{v1::ROLE_INFERENCE, 0, 0});
  REQUIRE(bad.ok());
  auto reg = [&](const std::string& name, std::vector<int64_t> shape, uint64_t length) {
    return bad->Register(TensorInfo{name, v1::DTYPE_BF16, std::move(shape), {}}, *scratch, 0,
                         length);
  };
  // Registering `name` over `length` bytes is refused with a message that `why` matches.
  auto refused = [&](const std::string& name, std::vector<int64_t> shape, uint64_t length,
                     const auto& why) {
    auto s = reg(name, std::move(shape), length);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(Message(s), why);
  };
  constexpr int64_t k2p62 = int64_t{1} << 62;

  SECTION("2^62 x 2^62 elements") {
    refused("huge", {k2p62, k2p62}, 1024,
            Catch::Contains("tensor 'huge'") && Catch::Contains("too large"));
  }
  SECTION("nine dimensions") {
    refused("nine", {1, 1, 1, 1, 1, 1, 1, 1, 2}, 4,
            Catch::Contains("tensor 'nine': 9 dimensions (at most 8)"));
  }
  SECTION("an empty name") { refused("", {2}, 4, Catch::Contains("empty name")); }
  SECTION("a 2000-character name") {
    refused(std::string(2000, 'x'), {2}, 4, Catch::Contains("longer than 1024 characters"));
  }
  SECTION("a name that is not UTF-8") {
    refused("w\xff\xfe", {2}, 4, Catch::Contains("tensor name is not valid UTF-8 (bytes 77fffe)"));
    // The session is still usable: the agent never saw the bad request.
    CHECK(reg("w", {2}, 4).ok());
    // é, 权, 😀 are fine (bytes of their own: two destinations may not share bytes).
    CHECK(
        bad->Register(TensorInfo{"w\xc3\xa9.\xe6\x9d\x83\xf0\x9f\x98\x80", v1::DTYPE_BF16, {2}, {}},
                      *scratch, 64, 4)
            .ok());
  }
  SECTION("a path-like name is only a name") {
    // Tensor names are keys, never paths: "../../etc" registers like any other name and
    // touches no file; it goes again when unregistered.
    REQUIRE(reg("../../etc", {2}, 4).ok());
    REQUIRE(bad->Unregister("../../etc").ok());
  }
  SECTION("many tiny tensors from one session") {
    // 10^4 one request each (scale_test registers 10^5 in batches; register_bench 10^6).
    constexpr int kMany = 10000;
    const auto t0 = std::chrono::steady_clock::now();
    int registered = 0;
    for (; registered < kMany; ++registered) {
      auto s =
          bad->Register(TensorInfo{"tiny." + std::to_string(registered), v1::DTYPE_U8, {1}, {}},
                        *scratch, registered % (1 << 20), 1);
      if (!s.ok()) {
        FAIL("tensor " << registered << ": " << Message(s));
      }
      if (SecondsSince(t0) > 60) break;  // bounded: report how far it got
    }
    WARN(registered << " tiny tensors registered in " << SecondsSince(t0) << " s");
    CHECK(registered == kMany);
    // The controller's view follows on the next heartbeat.
    CHECK(wb::testing::WaitUntil(
        [&] { return ListedTensors(ctl, "inference-node") == registered + 2; },
        std::chrono::seconds(10)));
    bad->Close();
    REQUIRE(wb::testing::WaitUntil([&] { return ListedTensors(ctl, "inference-node") == 2; },
                                   std::chrono::seconds(30)));
  }
  SECTION("a step with version 0") {
    auto s = ctl.Step(0);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(Message(s.status()), Catch::Contains("version 0 is not newer"));
  }

  // The daemons still serve: a normal registration and a step that commits.
  if (!bad.ok()) return;
  bad->Close();
  auto good =
      LocalSession::Connect(cluster.socket("inference-node"), Identity{v1::ROLE_INFERENCE, 0, 0});
  REQUIRE(good.ok());
  CHECK(good->Register(TensorInfo{"extra", v1::DTYPE_BF16, {2}, {}}, *scratch, 0, 4).ok());
  CHECK(wb::testing::WaitUntil([&] { return ListedTensors(ctl, "inference-node") == 3; },
                               std::chrono::seconds(10)));
  good->Close();
  REQUIRE(wb::testing::WaitUntil([&] { return ListedTensors(ctl, "inference-node") == 2; },
                                 std::chrono::seconds(30)));
  CommitsAgain(ctl, trainer.buffer, inference.buffer, 7);
}
