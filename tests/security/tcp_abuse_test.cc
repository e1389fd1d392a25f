// The tcp data plane under abuse (issue 14, class 6) with real processes: connections that
// never finish their HELLO, dribbling one byte at a time, are closed at the handshake deadline
// and capped per source address; an accept loop that hits EMFILE keeps accepting once
// descriptors are back; through a flood of ~1000 such connections a real step still commits.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "tests/support/cluster.h"
#include "tests/support/one_tensor.h"

using wb::client::ControllerClient;
using wb::testing::Cluster;
using Clock = std::chrono::steady_clock;

namespace {

// A non-blocking connection to 127.0.0.1:port from 127.0.0.2 (another source address on
// loopback, as an attacker on another host would be); -1 when none could be made.
int OpenFrom2(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(0x7f000002);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(0x7f000001);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 && errno != EINPROGRESS)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the other side closed or reset the connection.
bool Closed(int fd) {
  char b;
  ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN;
}

// One byte of a HELLO header ("WBTF"...) at a time on every connection, reopening those the
// receiver closed, until stopped.
class Dribbler {
 public:
  Dribbler(int port, int connections) : port_(port), fds_(connections, -1) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Dribbler() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  int closed_by_receiver() const { return closed_.load(); }
  int opened() const { return opened_.load(); }

 private:
  void Run() {
    const char header[] = "WBTF";
    size_t pos = 0;
    while (!stop_) {
      int reopened = 0;
      for (int& fd : fds_) {
        if (fd >= 0 && (Closed(fd) || ::send(fd, &header[pos % 4], 1, MSG_NOSIGNAL) < 0 &&
                                          errno != EAGAIN && errno != ENOTCONN)) {
          ::close(fd);
          fd = -1;
          ++closed_;
        }
        if (fd < 0 && reopened < 100) {  // bounded churn per round
          fd = OpenFrom2(port_);
          if (fd >= 0) ++opened_, ++reopened;
        }
      }
      ++pos;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  const int port_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_{0}, opened_{0};
  std::thread thread_;
};

int OpenDescriptors(pid_t pid) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("dribbling connections are cut off, capped, and do not stop a step", "[security]") {
  rlimit lim{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &lim) == 0);
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 8192);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &lim) == 0);
  REQUIRE(lim.rlim_cur >= 1200);

  wb::testing::ClusterOptions options;
  // Continues the agents' transports.tcp block.
  options.extra_agent_yaml =
      "    handshake_timeout_ms: 1000\n    max_unauthenticated_per_source: 16\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  const int port = cluster.tcp_port("inference-node");
  wb::testing::OneTensorShape shape;
  shape.rows = 1024;  // 2 MiB of bf16
  shape.cols = 1024;
  auto sides = wb::testing::OneTensorSides::Open(cluster, shape);
  const pid_t receiver = cluster.agent("inference-node")->pid();

  // 1. A few connections dribbling a HELLO are closed at the handshake deadline (the old
  // receiver reset its 30 s stall timer on every byte and held them for good).
  {
    const auto t0 = Clock::now();
    Dribbler few(port, 4);
    const bool cut = wb::testing::WaitUntil([&] { return few.closed_by_receiver() >= 4; },
                                            std::chrono::seconds(8));
    INFO("closed " << few.closed_by_receiver() << " after "
                   << std::chrono::duration<double>(Clock::now() - t0).count() << " s");
    CHECK(cut);
  }

  // 2. The receiver runs out of descriptors while connections pour in: accept fails with
  // EMFILE (the old accept loop then stopped for good); once descriptors are back it accepts.
  {
    rlimit old{}, low{};
    REQUIRE(prlimit(receiver, RLIMIT_NOFILE, nullptr, &old) == 0);
    low = old;
    low.rlim_cur = OpenDescriptors(receiver) + 4;
    REQUIRE(prlimit(receiver, RLIMIT_NOFILE, &low, nullptr) == 0);
    std::vector<int> fds;
    for (int i = 0; i < 64; ++i) fds.push_back(OpenFrom2(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    REQUIRE(prlimit(receiver, RLIMIT_NOFILE, &old, nullptr) == 0);
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    CHECK(wb::testing::WaitUntil(
        [&] {
          return cluster.Log("inference-node").find("Too many open files") != std::string::npos;
        },
        std::chrono::seconds(5)));
  }

  // 3. ~1000 dribbling connections from another address; meanwhile the sender connects (Plan)
  // and steps commit every byte.
  Dribbler flood(port, 1000);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanOneToOne(&ctl, std::chrono::seconds(30));
  for (uint64_t v = 1; v <= 2; ++v) {
    sides.Fill(uint8_t(0x40 + v));
    auto step = ctl.Step(v, std::chrono::seconds(20));
    INFO("step " << v << ": " << (step.ok() ? "" : std::string(step.status().message())));
    REQUIRE(step.ok());
    CHECK(sides.Same());
  }
  INFO("flood: " << flood.opened() << " connections opened, " << flood.closed_by_receiver()
                 << " closed by the receiver");
  CHECK(flood.opened() >= 1000);
  CHECK(flood.closed_by_receiver() >= 900);  // only 16 may wait for a HELLO at a time
  CHECK(cluster.agent("inference-node")->running());
  // At most the cap (plus the real sender's connections and the base) held by the receiver.
  CHECK(OpenDescriptors(receiver) < 200);
}
