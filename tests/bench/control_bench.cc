// control_bench: the control plane's step round trip at scale. A real wb-controller process and
// N agents (in this process, each with its own gRPC servers, or as wb-agent processes), half
// trainer nodes and half inference nodes, each pair sharing one tiny BF16 tensor. Plans once,
// then times ControllerClient::Step (call -> commit reply) over many steps and prints one JSON
// line with the latency percentiles and the controller's CPU time per step (/proc/PID/stat).
// --step-links=false sends the step commands on gRPC step streams instead of step links.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "common/process/mutex_mode.h"
#include "config/config.h"
#include "daemon/service/agent_node.h"
#include "tests/bench/bench_support.h"
#include "tests/support/process.h"

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

namespace {

using wb::bench::Die;

constexpr int64_t kElems = 2048;  // 4 KiB of BF16 per tensor

// The wb-controller this run started: a failed run must not leave it behind (exit skips the
// destructors that stop it).
pid_t g_controller_pid = -1;

void KillController() {
  if (g_controller_pid > 0) kill(g_controller_pid, SIGKILL);
}

// utime + stime of `pid` in milliseconds.
double CpuMs(pid_t pid) {
  std::string stat = wb::testing::ReadFile("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  if (close == std::string::npos) Die("cannot read /proc/" + std::to_string(pid) + "/stat");
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  // Fields after the command: state(3) ... utime(14) stime(15).
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Linux 6.16+ gives each threaded process a private futex hash sized by its CPUs (16 buckets on
// this 2-core machine), whatever its thread count. Every wake-up walks its bucket's chain of
// waiters: with 512 agents in this process (~5000 threads, ~300 waiters a bucket) futex_wake was
// a third of the agents' CPU, an artifact of running them in one process (each wb-agent has its
// own). Sized for the threads this process will have; returns the slots set, 0 if the kernel has
// no such setting (older kernels use their global hash).
int SizeFutexHash(int agents) {
#ifndef PR_FUTEX_HASH
  constexpr int PR_FUTEX_HASH = 78;
  constexpr int PR_FUTEX_HASH_SET_SLOTS = 1;
#endif
  int slots = 16;
  while (slots < agents * 16 && slots < (1 << 16)) slots *= 2;
  return prctl(PR_FUTEX_HASH, PR_FUTEX_HASH_SET_SLOTS, slots, 0, 0) == 0 ? slots : 0;
}

void RaiseFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  wb::testing::StopChildrenOnSignals();  // a killed run leaves no daemons behind
  CLI::App app{"control_bench: controller step round trip with N agents"};
  int agents = 32, steps = 200, warmup = 5;
  std::string mode = "inproc", bin_dir = "bazel-bin", log_level = "warn";
  int heartbeat_ms = 1000, heartbeat_timeout_ms = 30000;
  app.add_option("--agents", agents, "number of agents (even; half trainer, half inference)");
  app.add_option("--steps", steps, "timed steps")->check(CLI::Range(1, 10000000));
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::Range(0, 1000000));
  app.add_option("--mode", mode, "inproc: agents in this process; process: wb-agent processes")
      ->check(CLI::IsMember({"inproc", "process"}));
  app.add_option("--bin-dir", bin_dir, "where controller/wb-controller and daemon/wb-agent are");
  app.add_option("--log-level", log_level, "controller and agent log level");
  std::string controller_log_level;
  app.add_option("--controller-log-level", controller_log_level,
                 "the controller's log level (default: --log-level), e.g. info to see why it "
                 "planned again");
  app.add_option("--heartbeat-ms", heartbeat_ms, "agents' heartbeat interval")
      ->check(CLI::Range(10, 600000));
  bool step_links = true;
  app.add_option("--step-links", step_links,
                 "step commands on step links (true) or on gRPC step streams (false: the "
                 "controller's step_links setting)");
  CLI11_PARSE(app, argc, argv);
  wb::UseFastMutexes();  // as the daemons do: the in-process agents are daemons
  if (agents < 2 || agents % 2 != 0) Die("--agents must be even and at least 2");
  const int pairs = agents / 2;
  // Before any thread starts (the controller process is apart and keeps its default).
  const int futex_hash_slots = mode == "inproc" ? SizeFutexHash(agents) : 0;
  RaiseFileLimit();
  spdlog::set_level(spdlog::level::from_str(log_level));

  const std::string dir = wb::testing::TempDir("wb-cbench-");
  const int controller_port = wb::testing::FreePort();
  const std::string controller_address = "127.0.0.1:" + std::to_string(controller_port);
  std::ofstream(dir + "/controller.yaml")
      << "listen: " << controller_address
      << "\nlog_level: " << (controller_log_level.empty() ? log_level : controller_log_level)
      << "\nheartbeat_timeout_ms: " << heartbeat_timeout_ms
      << "\nstep_timeout_ms: 20000\nstep_links: " << (step_links ? "true" : "false")
      << "\nworld:\n  trainer_ranks: " << pairs << "\n  inference_replicas: " << pairs
      << "\n  inference_ranks_per_replica: 1\n";
  auto controller = std::make_unique<wb::testing::Process>(
      std::vector<std::string>{bin_dir + "/controller/wb-controller", "--config",
                               dir + "/controller.yaml"},
      dir + "/controller.log");
  g_controller_pid = controller->pid();
  wb::bench::OnDie(KillController);
  if (!wb::testing::WaitUntil([&] { return wb::testing::PortAccepts(controller_port); },
                              std::chrono::seconds(15))) {
    Die("wb-controller did not listen on " + controller_address + "; see " + dir +
        "/controller.log");
  }

  // Agents: a-0000 .. a-(N-1); even ones train, odd ones serve inference (pair = index / 2).
  std::vector<std::unique_ptr<wb::service::AgentNode>> nodes;
  std::vector<std::unique_ptr<wb::testing::Process>> processes;
  auto socket_of = [&](int i) { return dir + "/a" + std::to_string(i) + ".sock"; };
  const auto start0 = Clock::now();
  for (int i = 0; i < agents; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "a-%04d", i);
    if (mode == "inproc") {
      wb::config::AgentConfig c;
      c.name = name;
      c.log_level = log_level;
      c.local_socket = socket_of(i);
      c.listen = "127.0.0.1:0";
      c.controller = controller_address;
      c.heartbeat_interval_ms = heartbeat_ms;
      c.tcp.listen = "127.0.0.1:0";
      c.tcp.connections_per_peer = 1;
      c.local_enabled = true;
      c.executor.prepare_threads = 1;
      auto node = std::make_unique<wb::service::AgentNode>(c);
      if (auto s = node->Start(); !s.ok()) {
        Die("agent " + std::string(name) + " (#" + std::to_string(i) +
            ") did not start: " + std::string(s.message()));
      }
      nodes.push_back(std::move(node));
    } else {
      const std::string config = dir + "/" + name + ".yaml";
      std::ofstream(config) << "name: " << name << "\nlog_level: " << log_level
                            << "\nlocal_socket: " << socket_of(i)
                            << "\nlisten: 127.0.0.1:0\ncontroller: " << controller_address
                            << "\nheartbeat_interval_ms: " << heartbeat_ms
                            << "\ntransports:\n  tcp:\n    listen: 127.0.0.1:0\n"
                               "    connections_per_peer: 1\n";
      processes.push_back(std::make_unique<wb::testing::Process>(
          std::vector<std::string>{bin_dir + "/daemon/wb-agent", "--config", config},
          dir + "/" + name + ".log"));
    }
  }
  for (int i = 0; i < agents; ++i) {
    const std::string sock = socket_of(i);
    if (!wb::testing::WaitUntil([&] { return access(sock.c_str(), F_OK) == 0; },
                                std::chrono::seconds(60))) {
      Die("agent #" + std::to_string(i) + " never bound " + sock);
    }
  }

  // One session and one 4 KiB tensor per agent: pair p's trainer (rank p) and inference
  // replica p both hold "pair<p>.weight".
  std::vector<wb::client::SharedBuffer> buffers;
  std::vector<wb::client::LocalSession> sessions;
  for (int i = 0; i < agents; ++i) {
    const int pair = i / 2;
    const bool trainer = i % 2 == 0;
    wb::client::Identity who;
    who.role = trainer ? v1::ROLE_TRAINER : v1::ROLE_INFERENCE;
    who.rank = trainer ? pair : 0;
    who.replica = trainer ? 0 : pair;
    auto buffer = wb::client::SharedBuffer::Create(kElems * 2, "cb");
    if (!buffer.ok()) Die(std::string(buffer.status().message()));
    auto session = wb::client::LocalSession::Connect(socket_of(i), who);
    if (!session.ok()) Die(std::string(session.status().message()));
    wb::client::TensorInfo t{
        "pair" + std::to_string(pair) + ".weight", v1::DTYPE_BF16, {kElems}, {}};
    if (auto s = session->Register(t, *buffer, 0, kElems * 2); !s.ok()) {
      Die("register on agent #" + std::to_string(i) + ": " + std::string(s.message()));
    }
    buffers.push_back(std::move(*buffer));
    sessions.push_back(std::move(*session));
  }
  const double startup_seconds = std::chrono::duration<double>(Clock::now() - start0).count();

  auto ctl = wb::client::ControllerClient::Connect(controller_address);
  if (!ctl.ok()) Die(std::string(ctl.status().message()));
  v1::ExpectedWorld world;
  world.set_trainer_ranks(pairs);
  world.set_inference_replicas(pairs);
  world.set_inference_ranks_per_replica(1);
  const auto plan_t0 = Clock::now();
  auto plan = ctl->Plan(world, std::chrono::seconds(120));
  const double plan_seconds = std::chrono::duration<double>(Clock::now() - plan_t0).count();
  if (!plan.ok()) Die("plan: " + std::string(plan.status().message()));

  uint64_t version = 0;
  for (int i = 0; i < warmup; ++i) {
    auto r = ctl->Step(++version);
    if (!r.ok())
      Die("warm-up step " + std::to_string(version) + ": " + std::string(r.status().message()));
  }
  std::vector<double> ms;
  ms.reserve(steps);
  const double cpu0 = CpuMs(controller->pid());
  const double bench_cpu0 = CpuMs(getpid());  // the in-process agents (and the client)
  const auto run_t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    auto r = ctl->Step(++version);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!r.ok()) Die("step " + std::to_string(version) + ": " + std::string(r.status().message()));
  }
  const double run_seconds = std::chrono::duration<double>(Clock::now() - run_t0).count();
  const double cpu1 = CpuMs(controller->pid());
  const double bench_cpu1 = CpuMs(getpid());

  double sum = 0;
  for (double m : ms) sum += m;
  nlohmann::json out;
  out["bench"] = "control";
  out["mode"] = mode;
  out["step_links"] = step_links;
  out["agents"] = agents;
  out["agents_per_side"] = pairs;
  out["steps"] = steps;
  out["bytes_per_step"] = plan->total_bytes();
  out["startup_seconds"] = startup_seconds;
  out["plan_seconds"] = plan_seconds;
  out["mean_ms"] = steps ? sum / steps : 0;
  out["p50_ms"] = Percentile(ms, 0.50);
  out["p99_ms"] = Percentile(ms, 0.99);
  out["max_ms"] = Percentile(ms, 1.0);
  out["steps_per_second"] = steps / run_seconds;
  out["controller_cpu_ms_per_step"] = steps ? (cpu1 - cpu0) / steps : 0;
  // inproc: the agents (and the client); process: the client alone.
  out["bench_process_cpu_ms_per_step"] = steps ? (bench_cpu1 - bench_cpu0) / steps : 0;
  out["futex_hash_slots"] = futex_hash_slots;
  wb::bench::AddMachineInfo(&out);
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);

  sessions.clear();
  for (auto& n : nodes) n->Shutdown();
  nodes.clear();
  processes.clear();
  controller.reset();
  g_controller_pid = -1;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);  // configs, sockets and logs
  return 0;
}
