// A data-plane link cut mid-transfer: two agents in two network namespaces joined by a veth
// pair (10.99.0.1/24 and 10.99.0.2/24, inside the namespaces only); the controller and this
// test run in the first namespace. The link goes down while the sender is mid-transfer: the step
// fails naming the peer within the write timeout; with the link up again the next step commits.
// Needs root and `ip netns`; otherwise SKIPs (prints why) and passes.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/process.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Process;

namespace {

// 32 MiB per tensor: more than the socket buffers hold, so a frozen receiver stalls the sender.
constexpr int64_t kRows = 16384, kCols = 1024;
constexpr uint64_t kTensorBytes = kRows * kCols * 2;

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// Two namespaces and a veth pair between them; removed on destruction.
struct Namespaces {
  std::string a = "wbf-a-" + std::to_string(getpid());
  std::string b = "wbf-b-" + std::to_string(getpid());
  std::string link_a = "wbfa" + std::to_string(getpid() % 100000);
  std::string link_b = "wbfb" + std::to_string(getpid() % 100000);
  bool ok = false;

  Namespaces() {
    if (geteuid() != 0) return;
    ok = Sh("ip netns add " + a) == 0 && Sh("ip netns add " + b) == 0 &&
         Sh("ip link add " + link_a + " type veth peer name " + link_b) == 0 &&
         Sh("ip link set " + link_a + " netns " + a) == 0 &&
         Sh("ip link set " + link_b + " netns " + b) == 0 &&
         Sh("ip -n " + a + " addr add 10.99.0.1/24 dev " + link_a) == 0 &&
         Sh("ip -n " + b + " addr add 10.99.0.2/24 dev " + link_b) == 0 &&
         Sh("ip -n " + a + " link set lo up") == 0 && Sh("ip -n " + b + " link set lo up") == 0 &&
         SetLink(true);
  }
  ~Namespaces() {
    Sh("ip netns del " + a);
    Sh("ip netns del " + b);
  }
  bool SetLink(bool up) {
    const std::string state = up ? " up" : " down";
    return Sh("ip -n " + a + " link set " + link_a + state) == 0 &&
           Sh("ip -n " + b + " link set " + link_b + state) == 0;
  }
  // Moves this (still single-threaded) process into namespace `a`.
  bool Enter() {
    int fd = open(("/run/netns/" + a).c_str(), O_RDONLY);
    if (fd < 0) return false;
    const bool entered = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return entered;
  }
};

std::string Message(const absl::Status& s) { return std::string(s.message()); }

std::pair<SharedBuffer, LocalSession> OpenSide(const std::string& socket, v1::Role role) {
  auto b = SharedBuffer::Create(2 * kTensorBytes, "side");
  REQUIRE(b.ok());
  auto s = LocalSession::Connect(socket, Identity{role, 0, 0});
  REQUIRE(s.ok());
  for (int i = 0; i < 2; ++i) {
    TensorInfo t{i == 0 ? "a.weight" : "b.weight", v1::DTYPE_BF16, {kRows, kCols}, {}};
    auto r = s->Register(t, *b, i * kTensorBytes, kTensorBytes);
    INFO(Message(r));
    REQUIRE(r.ok());
  }
  return {std::move(*b), std::move(*s)};
}

void Fill(const SharedBuffer& b, uint32_t version) {
  auto* p = static_cast<uint16_t*>(b.data());
  for (uint64_t i = 0; i < b.size() / 2; ++i) {
    p[i] = static_cast<uint16_t>(0x3c00 + ((i * 7 + version * 13) & 0x3ff));
  }
}

}  // namespace

TEST_CASE("a link cut mid-transfer fails the step naming the peer; link up, the next commits") {
  Namespaces ns;
  if (!ns.ok) {
    WARN("SKIPPED: needs root and `ip netns` (network namespaces could not be made)");
    return;
  }
  REQUIRE(ns.Enter());
  const std::string dir = wb::testing::TempDir("wb-netns-");
  const std::string ctl_addr = "10.99.0.1:17100";
  std::ofstream(dir + "/controller.yaml")
      << "listen: " << ctl_addr << "\nlog_level: info\nheartbeat_timeout_ms: 10000\n"
      << "step_timeout_ms: 20000\nworld:\n  trainer_ranks: 1\n  inference_replicas: 1\n"
      << "  inference_ranks_per_replica: 1\n";
  auto agent_yaml = [&](const std::string& name, const std::string& ip) {
    std::ofstream(dir + "/" + name + ".yaml")
        << "name: " << name << "\nlog_level: info\nlocal_socket: " << dir << "/" << name
        << ".sock\nlisten: " << ip << ":17101\ncontroller: " << ctl_addr
        << "\nheartbeat_interval_ms: 200\ntransports:\n  tcp:\n    listen: " << ip
        << ":0\nexecutor:\n  write_timeout_ms: 2000\n";
  };
  agent_yaml("trainer-node", "10.99.0.1");
  agent_yaml("inference-node", "10.99.0.2");
  auto in_ns = [&](const std::string& netns, const std::string& bin, const std::string& name) {
    return std::make_unique<Process>(
        std::vector<std::string>{"/usr/sbin/ip", "netns", "exec", netns, wb::testing::Runfile(bin),
                                 "--config", dir + "/" + name + ".yaml"},
        dir + "/" + name + ".log");
  };
  auto controller = in_ns(ns.a, "controller/wb-controller", "controller");
  auto sender = in_ns(ns.a, "daemon/wb-agent", "trainer-node");
  auto receiver = in_ns(ns.b, "daemon/wb-agent", "inference-node");
  for (const char* name : {"trainer-node", "inference-node"}) {
    const std::string sock = dir + "/" + name + ".sock";
    REQUIRE(wb::testing::WaitUntil([&] { return access(sock.c_str(), F_OK) == 0; },
                                   std::chrono::seconds(15)));
  }
  auto [src, trainer] = OpenSide(dir + "/trainer-node.sock", v1::ROLE_TRAINER);
  auto [dst, inference] = OpenSide(dir + "/inference-node.sock", v1::ROLE_INFERENCE);
  REQUIRE(inference.Watch().ok());
  auto ctl = ControllerClient::Connect(ctl_addr);
  REQUIRE(ctl.ok());
  v1::ExpectedWorld world;
  world.set_trainer_ranks(1);
  world.set_inference_replicas(1);
  world.set_inference_ranks_per_replica(1);
  // The controller may still be starting: wait until it answers.
  REQUIRE(wb::testing::WaitUntil([&] { return ctl->Status().ok(); }, std::chrono::seconds(15)));
  auto plan = ctl->Plan(world, std::chrono::seconds(20));
  INFO((plan.ok() ? "" : Message(plan.status())));
  REQUIRE(plan.ok());

  Fill(src, 1);
  auto first = ctl->Step(1);
  INFO((first.ok() ? "" : Message(first.status())));
  REQUIRE(first.ok());
  REQUIRE(std::memcmp(src.data(), dst.data(), src.size()) == 0);
  REQUIRE(inference.NextEvent(std::chrono::seconds(5)).ok());  // begin 1
  REQUIRE(inference.NextEvent(std::chrono::seconds(5)).ok());  // commit 1

  // At begin, freeze the receiver so the sender is surely mid-transfer, cut the link, let the
  // receiver go on: no byte can cross any more.
  Fill(src, 2);
  std::thread cutter([&] {
    auto e = inference.NextEvent(std::chrono::seconds(20));
    if (e.ok() && e->kind() == v1::Event::KIND_BEGIN) {
      receiver->Signal(SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ns.SetLink(false);
      receiver->Signal(SIGCONT);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto cut = ctl->Step(2, std::chrono::seconds(15));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cutter.join();
  REQUIRE_FALSE(cut.ok());
  INFO(Message(cut.status()));
  CHECK_THAT(Message(cut.status()), Catch::Contains("inference-node"));
  CHECK(seconds < 10);  // the 2 s write timeout, not the 15 s step timeout

  REQUIRE(ns.SetLink(true));
  // After a failed step the sending agent connects to its peers afresh before the next one, so
  // a step commits as soon as the link (and inference-node's registration, whose heartbeats
  // failed during the cut) is back.
  Fill(src, 3);
  absl::StatusOr<v1::StepResult> next = absl::UnknownError("not run");
  for (uint64_t v = 3; v < 60 && !next.ok(); ++v) {
    next = ctl->Step(v);
    if (!next.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  INFO((next.ok() ? "" : Message(next.status())));
  REQUIRE(next.ok());
  CHECK(std::memcmp(src.data(), dst.data(), src.size()) == 0);
}
