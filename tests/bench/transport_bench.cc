// Transport throughput benchmark: moves --bytes in batches of --depth writes of --msg bytes from
// this process into a receiver process it spawns (itself, with --role=receiver), and prints one
// JSON line: {"transport", "bytes", "msg", "depth", "streams", "seconds", "gbps" (GB/s)}.
// The local transport runs in one process (it only connects to itself).
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/transport/factory.h"
#include "tests/bench/bench_support.h"
#include "tests/transport/suite_util.h"
#include "weightbeam/v1/types.pb.h"

namespace {

using wb::bench::Die;

using wb::transport::Access;
using wb::transport::MemoryRef;
using wb::transport::Transport;
using wb::transport::WriteOp;

struct Flags {
  std::string transport = "tcp";
  uint64_t bytes = uint64_t{8} << 30;
  uint64_t msg = uint64_t{4} << 20;
  int depth = 16;
  int streams = 4;
  int inflight = 2;  // batches posted ahead
  std::string device;
  std::string role = "sender";
  int ctl_fd = -1;
};

// The control channel to the receiver process (length-prefixed messages, as in the transport
// suite); the benchmark cannot go on without it.
void SendMessage(int fd, const std::string& m) {
  if (!wb::transport::testing::SendMessage(fd, m)) Die("control channel closed");
}

std::string ReceiveMessage(int fd) {
  auto m = wb::transport::testing::ReceiveMessage(fd);
  if (!m.ok()) Die(std::string(m.status().message()));
  return *m;
}

wb::config::AgentConfig BenchConfig(const Flags& flags) {
  wb::config::AgentConfig config;
  config.source = "<transport_bench>";
  config.tcp.listen = "127.0.0.1:0";
  config.tcp.connections_per_peer = flags.streams;
  config.rdma.enabled = true;
  if (!flags.device.empty()) config.rdma.devices = {flags.device};
  return config;
}

std::unique_ptr<Transport> Make(const Flags& flags) {
  auto transport = wb::transport::MakeTransport(flags.transport, BenchConfig(flags));
  if (!transport.ok()) Die(transport.status().ToString());
  return std::move(*transport);
}

weightbeam::v1::RegionDescriptor Register(Transport* t, std::vector<uint8_t>& buf, Access access) {
  auto desc = t->Register(MemoryRef{buf.data(), buf.size()}, access);
  if (!desc.ok()) Die(desc.status().ToString());
  return *desc;
}

constexpr uint64_t kBenchStep = 1;

int RunReceiver(const Flags& flags) {
  auto transport = Make(flags);
  // As in an agent: the step fence armed and open for the sender's step (every write checked).
  if (auto st = transport->OpenStep(kBenchStep); !st.ok()) Die(st.ToString());
  std::vector<uint8_t> region(flags.msg * flags.depth, 0);
  auto desc = Register(transport.get(), region, Access::kDestination);
  auto reply = transport->Accept("bench-sender", ReceiveMessage(flags.ctl_fd));
  if (!reply.ok()) Die(reply.status().ToString());
  SendMessage(flags.ctl_fd, *reply);
  SendMessage(flags.ctl_fd, desc.SerializeAsString());
  char byte;
  while (::read(flags.ctl_fd, &byte, 1) > 0) {
  }  // runs until the sender closes the channel
  return 0;
}

pid_t SpawnReceiver(const Flags& flags, int* ctl_fd) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Die("socketpair failed");
  pid_t pid = fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    fcntl(fds[1], F_SETFD, 0);  // keep the child's end across exec
    std::vector<std::string> args = {"transport_bench",
                                     "--role=receiver",
                                     "--ctl-fd=" + std::to_string(fds[1]),
                                     "--transport=" + flags.transport,
                                     "--msg=" + std::to_string(flags.msg),
                                     "--depth=" + std::to_string(flags.depth),
                                     "--streams=" + std::to_string(flags.streams)};
    if (!flags.device.empty()) args.push_back("--device=" + flags.device);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  ::close(fds[1]);
  *ctl_fd = fds[0];
  return pid;
}

int RunSender(const Flags& flags) {
  int ctl_fd = -1;
  pid_t child = -1;
  auto transport = Make(flags);
  const bool remote = transport->caps().remote;
  if (remote) {
    transport.reset();  // fork without our transport threads, then build it again
    child = SpawnReceiver(flags, &ctl_fd);
    transport = Make(flags);
  }
  const uint64_t window = flags.msg * flags.depth;
  std::vector<uint8_t> src(window, 0x5a);
  auto src_desc = Register(transport.get(), src, Access::kSource);

  std::vector<uint8_t> local_dst;  // only for the local transport
  weightbeam::v1::RegionDescriptor dst_desc;
  absl::StatusOr<std::shared_ptr<wb::transport::Peer>> peer;
  if (remote) {
    peer = transport->Connect("bench-sender", "bench-receiver", [&](const std::string& record) {
      SendMessage(ctl_fd, record);
      return absl::StatusOr<std::string>(ReceiveMessage(ctl_fd));
    });
    if (peer.ok()) dst_desc.ParseFromString(ReceiveMessage(ctl_fd));
  } else {
    local_dst.assign(window, 0);
    dst_desc = Register(transport.get(), local_dst, Access::kDestination);
    Transport* self = transport.get();
    peer = transport->Connect("bench", "bench", [self](const std::string& record) {
      return self->Accept("bench", record);
    });
  }
  if (!peer.ok()) Die(peer.status().ToString());
  if (auto st = (*peer)->AddRemoteRegion(dst_desc); !st.ok()) Die(st.ToString());

  auto make_batch = [&](uint64_t bytes_left) {
    std::vector<WriteOp> ops;
    for (int i = 0; i < flags.depth && bytes_left > 0; ++i) {
      const uint64_t len = std::min(flags.msg, bytes_left);
      ops.push_back(WriteOp{src_desc.region_id(), i * flags.msg, dst_desc.region_id(),
                            i * flags.msg, len, kBenchStep});
      bytes_left -= len;
    }
    return ops;
  };
  // Warm-up: connections, page faults of both regions.
  if (auto st = (*peer)->WriteBatch(make_batch(window), std::chrono::minutes(5)); !st.ok()) {
    Die(st.ToString());
  }

  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  absl::Status failure;
  uint64_t posted = 0;
  const auto start = std::chrono::steady_clock::now();
  while (posted < flags.bytes) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight < flags.inflight; });
      if (!failure.ok()) break;
      ++in_flight;
    }
    auto ops = make_batch(flags.bytes - posted);
    for (const auto& op : ops) posted += op.length;
    (*peer)->PostBatch(std::move(ops), [&](absl::Status st) {
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      if (!st.ok() && failure.ok()) failure = st;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!failure.ok()) Die(failure.ToString());

  nlohmann::json line = {{"transport", flags.transport},
                         {"bytes", posted},
                         {"msg", flags.msg},
                         {"depth", flags.depth},
                         {"streams", flags.streams},
                         {"seconds", seconds},
                         {"gbps", static_cast<double>(posted) / seconds / 1e9}};
  wb::bench::AddMachineInfo(&line);
  std::cout << line.dump() << std::endl;

  peer->reset();
  transport.reset();
  if (remote) {
    ::close(ctl_fd);
    int status = 0;
    waitpid(child, &status, 0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"weightbeam transport throughput benchmark (prints one JSON line)"};
  app.add_option("--transport", flags.transport, "rdma, tcp or local");
  app.add_option("--bytes", flags.bytes, "bytes to move in total");
  app.add_option("--msg", flags.msg, "bytes per write");
  app.add_option("--depth", flags.depth, "writes per batch");
  app.add_option("--streams", flags.streams, "tcp connections per peer");
  app.add_option("--inflight", flags.inflight, "batches posted ahead of completion");
  app.add_option("--device", flags.device, "rdma device (e.g. rxe0)");
  app.add_option("--role", flags.role, "sender (default) or receiver (internal)");
  app.add_option("--ctl-fd", flags.ctl_fd, "control socket (internal)");
  CLI11_PARSE(app, argc, argv);
  if (flags.msg == 0 || flags.depth < 1 || flags.inflight < 1 || flags.streams < 1) {
    Die("--msg, --depth, --inflight and --streams must be positive");
  }
  if (flags.role == "receiver") return RunReceiver(flags);
  return RunSender(flags);
}
