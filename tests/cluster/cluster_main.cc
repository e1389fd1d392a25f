// wb-cluster: a cluster in miniature. The real daemons, each agent in its own network namespace
// with its own IP on a bridge, every link rate-limited with tc (tbf, both directions), so the
// links and not the CPU are the bottleneck. tests/cluster/cluster.sh makes the namespaces and
// tears them down; this driver runs inside the controller's namespace, shapes the links,
// starts the controller, the agents and the synthetic trainer ranks / inference workers of a
// scaled-down Kimi-K2-shaped MoE, runs the scenarios and reports every step against the
// link-limited ideal and the planner's prediction. See docs/cluster.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/report_format.h"
#include "client/step_trace.h"
#include "client/table.h"
#include "client/weightbeam/controller_client.h"
#include "tests/cluster/cluster_model.h"
#include "tests/cluster/cluster_roles.h"
#include "tests/demo/line_child.h"
#include "tests/support/process.h"

namespace v1 = weightbeam::v1;
using wb::client::FixedPoint;
using wb::client::HumanBytes;
using wb::cluster::ClusterShape;
using wb::testing::Process;

namespace {

// ---------------------------------------------------------------- processes and commands

using Child = wb::demo::LineChild;  // speaks the line protocol on its stdin/stdout
using wb::demo::SelfPath;

// How long the driver waits for a child's line: nothing it reads may block for good (a worker
// whose replica was skipped says nothing; a killed agent's workers exit).
constexpr std::chrono::seconds kLineTimeout{120};

// Runs a shell command; its output (stdout) or "" on failure, with *ok set.
std::string Run(const std::string& cmd, bool* ok = nullptr) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    if (ok) *ok = false;
    return "";
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  if (ok) *ok = rc == 0;
  return out;
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds (user + system) a process has used, from /proc/PID/stat; 0 when it is gone.
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto close_paren = s.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream in(s.substr(close_paren + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

// Busy and total jiffies of the whole machine, from /proc/stat.
std::pair<double, double> HostCpu() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double v[10] = {0};
  f >> cpu;
  double total = 0;
  for (double& x : v) {
    f >> x;
    total += x;
  }
  const double idle = v[3] + v[4];
  return {total - idle, total};
}

// ---------------------------------------------------------------- the network

struct Link {
  std::string agent;  // agent name, e.g. trainer-0
  std::string ns;     // its namespace
  std::string ip;
  std::string port;  // the switch-side veth in the switch namespace (eth0 inside `ns`)
  double mbit = 0;
};

class Network {
 public:
  Network(std::string prefix, double switch_queue_s)
      : prefix_(std::move(prefix)), switch_queue_s(switch_queue_s) {}
  std::string Ns(const std::string& suffix) const { return prefix_ + "-" + suffix; }

  // tbf on both ends of the agent's veth: egress of eth0 in its namespace (what it sends) and
  // egress of its port on the bridge (what it receives). Burst: 10 ms of the rate, at least
  // 128 KiB (veth hands tbf 64 KiB GSO packets).
  // The agent's own egress queue stands for a host's NIC queue: it must hold what the agent's
  // sockets may hand it (TCP small queues: about two 64 KiB GSO packets per connection, 16
  // connections from one trainer to four inference agents), else it drops locally. A TCP
  // socket whose every segment is in flight and acknowledged (between two jobs) and whose next
  // send is dropped there arms the window-probe timer; probes that cannot leave for local
  // congestion are retried every 500 ms and each counts against tcp_retries2 (15), so after
  // ~7.5 s of a full queue the kernel aborts the connection (ETIMEDOUT: "send failed:
  // Connection timed out") although the link moves. 50 ms of a 50 Mbit/s link (~440 KB) was
  // far too small; half a second of the rate, at least 8 MiB, never drops (TSQ bounds what the
  // sockets queue). The switch port keeps its configured queue.
  absl::Status Shape(Link& link, double mbit) {
    const double bytes_per_s = mbit * 1e6 / 8;
    const uint64_t burst = std::max<uint64_t>(128 << 10, static_cast<uint64_t>(bytes_per_s / 100));
    auto tbf = [&](uint64_t queue_bytes) {
      return absl::StrCat(" root tbf rate ", static_cast<uint64_t>(mbit * 1000), "kbit burst ",
                          burst, " limit ", burst + queue_bytes);
    };
    const uint64_t host_queue =
        std::max<uint64_t>(8 << 20, static_cast<uint64_t>(bytes_per_s * 0.5));
    bool ok1 = false, ok2 = false;
    std::string e1 = Run("tc -n " + link.ns + " qdisc replace dev eth0" + tbf(host_queue), &ok1);
    std::string e2 = Run("tc -n " + Ns("sw") + " qdisc replace dev " + link.port +
                             tbf(static_cast<uint64_t>(bytes_per_s * switch_queue_s)),
                         &ok2);
    if (!ok1 || !ok2) {
      return absl::InternalError(absl::StrCat("tc on ", link.agent, "'s link: ", e1, e2));
    }
    link.mbit = mbit;
    return absl::OkStatus();
  }

  // What the agent's own egress queue dropped (tbf on eth0 in its namespace) and how many of its
  // TCP connections the kernel gave up on (retransmissions or window probes unanswered or not
  // sent: TcpExtTCPAbortOnTimeout), since the namespace was made.
  std::pair<uint64_t, uint64_t> Drops(const Link& link) const {
    uint64_t dropped = 0, aborted = 0;
    const std::string tc = Run("tc -n " + link.ns + " -s qdisc show dev eth0");
    if (auto at = tc.find("dropped "); at != std::string::npos) {
      dropped = std::strtoull(tc.c_str() + at + 8, nullptr, 10);
    }
    std::istringstream in(Run("ip netns exec " + link.ns + " nstat -saz TcpExtTCPAbortOnTimeout"));
    std::string name;
    uint64_t value = 0;
    while (in >> name) {
      if (name == "TcpExtTCPAbortOnTimeout" && in >> value) aborted = value;
    }
    return {dropped, aborted};
  }

  // Bytes through every switch port: rx = what the agent sent, tx = what it received.
  std::map<std::string, std::pair<uint64_t, uint64_t>> Counters() const {
    std::map<std::string, std::pair<uint64_t, uint64_t>> out;
    std::istringstream in(
        Run("ip netns exec " + Ns("sw") +
            " sh -c 'for d in /sys/class/net/*; do echo ${d##*/} $(cat $d/statistics/rx_bytes) "
            "$(cat $d/statistics/tx_bytes); done'"));
    std::string name;
    uint64_t rx, tx;
    while (in >> name >> rx >> tx) out[name] = {rx, tx};
    return out;
  }

 private:
  std::string prefix_;
  double switch_queue_s;
};

// ---------------------------------------------------------------- report

struct LinkBytes {
  uint64_t sent = 0, received = 0;     // payload (the plan's / the step's bytes)
  uint64_t wire_out = 0, wire_in = 0;  // through the link (headers, control traffic)
  bool received_known = true;
};

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string Num(double v, int digits = 3) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// ---------------------------------------------------------------- the cluster

struct Options {
  ClusterShape shape;
  double link_mbit = 0;
  double link_seconds = 8;  // auto-sized model: the busiest link carries this long per step
  int steps = 3;
  std::vector<std::string> scenarios;
  std::string prefix, bin_dir, subnet = "10.213.0", json_out;
  bool keep_logs = false;
  // Nobody waits (docs/clients.md): trainer agents capture (capture.max_bytes), inference
  // agents stage (receive.mode staged).
  bool capture = false;
  bool staged = false;
  int trace_ms = 0;
  double switch_queue_ms = 250;
  std::string timeline;  // the committed steps as a Chrome/Perfetto trace (wbctl trace)
  // The failover scenario (issue 45): etcd and two controllers in high availability, each in
  // a namespace of its own (cluster.sh makes "ca", "cb" and "etcd" for it).
  bool ha = false;
  int lease_ttl_ms = 2000;
};

class Cluster {
 public:
  explicit Cluster(Options o) : o_(std::move(o)), net_(o_.prefix, o_.switch_queue_ms / 1000.0) {}
  ~Cluster() {
    workers_.clear();
    trainers_.clear();
    agents_.clear();
    controller_.reset();
    controller_b_.reset();
    etcd_.reset();
  }

  int Main();

 private:
  const ClusterShape& shape() const { return o_.shape; }
  std::string AgentName(int i) const {
    const int t = shape().trainer_nodes;
    return i < t ? absl::StrCat("trainer-", i) : absl::StrCat("infer-", i - t);
  }
  int AgentCount() const { return shape().trainer_nodes + shape().inference_nodes; }
  std::string Socket(int i) const { return dir_ + "/" + AgentName(i) + ".sock"; }
  // The controller(s) agents and the client are given: with --scenario failover, both
  // controllers of the election ("a" leads first).
  std::string Ctl() const { return o_.ha ? CtlA() + "," + CtlB() : o_.subnet + ".1:7100"; }
  std::string CtlA() const { return o_.subnet + ".2:7100"; }
  std::string CtlB() const { return o_.subnet + ".3:7100"; }
  std::string EtcdUrl() const { return "http://" + o_.subnet + ".4:2379"; }

  absl::Status SetUp();
  // With o_.ha: etcd and controllers "a" and "b" in their namespaces, once "a" leads.
  absl::Status StartHa(const std::string& controller_yaml);
  // "leader" / "standby" / "taking over" of one controller ("" when it does not answer).
  std::string StateOf(const std::string& address);
  absl::Status StartAgent(int i);
  absl::Status StartWorkers(int node);
  absl::Status StartTrainers();
  absl::Status MakePlan(v1::DeltaChoice delta, v1::RelayChoice relays = v1::RELAY_CHOICE_CONFIG);
  std::vector<std::unique_ptr<Child>*> WorkersOf(int node);

  // One step: perturb, Step, verify, report. `fault` runs on a thread while the step is in
  // flight. Returns false when the step failed (reported as such). Workers of replicas the step
  // skipped are not asked; the result is in last_step_ (unset when the step failed).
  bool RunStep(const std::string& scenario, const std::function<void()>& fault = nullptr,
               const std::string& note = "");
  // Worker g's answer for version v: "verified v ...", skipping abort lines and answers for
  // older versions; "" when it is gone or says nothing within `timeout`.
  std::string VerifiedLine(size_t g, uint32_t v, std::chrono::milliseconds timeout);
  bool KillScenario();
  bool FailoverScenario();
  // One failover: cuts controller `name`'s namespace `ns` mid-step (it leads at `leader`), the
  // one at `standby` must lead and the step commit there; then joins it back as a standby.
  struct Failover {
    bool ok = false, committed = false, stands_by = false;
    double leaderless = -1, committed_after = 0;
  };
  Failover CutLeader(const std::string& name, const std::string& ns, const std::string& leader,
                     const std::string& standby);
  bool SlowLinkScenario();
  bool RelayScenario();
  bool Scenario(const std::string& name);

  Options o_;
  Network net_;
  std::string dir_;
  std::vector<Link> links_;
  std::unique_ptr<Process> controller_;
  std::unique_ptr<Process> controller_b_;  // --scenario failover: the standby
  std::unique_ptr<Process> etcd_;
  std::vector<std::unique_ptr<Process>> agents_;
  std::vector<std::unique_ptr<Child>> trainers_;
  std::vector<std::unique_ptr<Child>> workers_;  // index replica * tp + rank
  std::vector<uint64_t> worker_bytes_;
  std::unique_ptr<wb::client::ControllerClient> client_;
  v1::ExpectedWorld world_;
  v1::PlanSummary plan_;
  double rail_gbps_ = 0;  // what the agents' tcp rails report to the planner (transports.tcp.gbps)
  uint32_t version_ = 0;
  uint32_t trained_ = 0;  // the version the trainer ranks hold
  std::vector<std::string> json_;
  std::vector<weightbeam::v1::StepResult> committed_;  // for --timeline
  bool all_verified_ = true;
  bool async_steps_ = false;  // RunStep through StepAsync (as with --capture)
  std::optional<v1::StepResult> last_step_;
  double last_capacity_ideal_ = 0;  // of last_step_: see RunStep
  std::string last_error_;
};

absl::Status Cluster::SetUp() {
  const int n = AgentCount();
  for (int i = 0; i < n; ++i) {
    const bool trainer = i < shape().trainer_nodes;
    const int k = trainer ? i : i - shape().trainer_nodes;
    Link l;
    l.agent = AgentName(i);
    l.ns = net_.Ns(absl::StrCat(trainer ? "t" : "i", k));
    l.port = absl::StrCat(trainer ? "t" : "i", k);
    l.ip = absl::StrCat(o_.subnet, ".", trainer ? 10 + k : 100 + k);
    if (auto s = net_.Shape(l, o_.link_mbit); !s.ok()) return s;
    links_.push_back(l);
  }
  // Agents run without the local transport: every transfer here crosses a link, and the
  // planner would count its "local" NIC as a second rail for them (halving its prediction).
  // The controller's own link stays unshaped (a management network).
  const std::string ctl_yaml = absl::StrCat(
      "listen: ", Ctl(), "\nlog_level: warn\nheartbeat_timeout_ms: 3000\nstep_timeout_ms: 300000\n",
      "plan_wait_ms: 60000\nworld:\n  trainer_ranks: ", shape().trainer_ranks(),
      "\n  inference_replicas: ", shape().inference_replicas(),
      "\n  inference_ranks_per_replica: ", shape().inference_tp(),
      "\ncost_model:\n  nic_gbps: ", Num(o_.link_mbit / 8000, 6),
      "\ndelta:\n  enabled: false\n  verify: true\n");
  if (o_.ha) {
    if (auto s = StartHa(ctl_yaml); !s.ok()) return s;
  } else {
    WriteFile(dir_ + "/controller.yaml", ctl_yaml);
    controller_ =
        std::make_unique<Process>(std::vector<std::string>{o_.bin_dir + "/controller/wb-controller",
                                                           "--config", dir_ + "/controller.yaml"},
                                  dir_ + "/controller.log");
  }
  for (int i = 0; i < n; ++i) {
    const Link& l = links_[i];
    WriteFile(dir_ + "/" + l.agent + ".yaml",
              absl::StrCat(
                  "name: ", l.agent, "\nlog_level: warn\nlocal_socket: ", Socket(i),
                  "\nlisten: ", l.ip, ":7101\ncontroller: ", Ctl(),
                  "\nheartbeat_interval_ms: 500\ntransports:\n  tcp:\n    listen: ", l.ip,
                  ":7201\n    gbps: ", Num(o_.link_mbit / 8000, 6),
                  "\n  local:\n    enabled: false\nexecutor:\n  staging_watermark_bytes: 256MiB\n",
                  o_.capture && i < shape().trainer_nodes ? "capture:\n  max_bytes: 64GiB\n" : "",
                  o_.staged && i >= shape().trainer_nodes ? "receive:\n  mode: staged\n" : ""));
    agents_.emplace_back();
    if (auto s = StartAgent(i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Cluster::StartHa(const std::string& controller_yaml) {
  const std::string peer = "http://" + o_.subnet + ".4:2380";
  etcd_ = std::make_unique<Process>(
      std::vector<std::string>{"/usr/sbin/ip", "netns", "exec", net_.Ns("etcd"), "/usr/bin/etcd",
                               "--name", "m0", "--data-dir", dir_ + "/etcd", "--listen-client-urls",
                               EtcdUrl(), "--advertise-client-urls", EtcdUrl(),
                               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                               "--initial-cluster", "m0=" + peer},
      dir_ + "/etcd.log");
  for (const auto& [name, address] : {std::pair{"a", CtlA()}, std::pair{"b", CtlB()}}) {
    const std::string yaml = absl::StrCat(
        absl::StrReplaceAll(controller_yaml, {{"listen: " + Ctl(), "listen: " + address},
                                              {"log_level: warn", "log_level: info"}}),
        "ha:\n  etcd: [", EtcdUrl(), "]\n  election: cluster\n  lease_ttl_ms: ", o_.lease_ttl_ms,
        "\n");
    WriteFile(absl::StrCat(dir_, "/controller-", name, ".yaml"), yaml);
    (std::string(name) == "a" ? controller_ : controller_b_) = std::make_unique<Process>(
        std::vector<std::string>{"/usr/sbin/ip", "netns", "exec", net_.Ns(absl::StrCat("c", name)),
                                 o_.bin_dir + "/controller/wb-controller", "--config",
                                 absl::StrCat(dir_, "/controller-", name, ".yaml")},
        absl::StrCat(dir_, "/controller-", name, ".log"));
    // "a" leads first, so the scenario knows whose namespace to cut.
    if (std::string(name) == "a" &&
        !wb::testing::WaitUntil([&] { return StateOf(CtlA()) == "leader"; },
                                std::chrono::seconds(30))) {
      return absl::UnavailableError(absl::StrCat("controller a did not lead (see ", dir_, ")"));
    }
  }
  return absl::OkStatus();
}

std::string Cluster::StateOf(const std::string& address) {
  auto one = wb::client::ControllerClient::Connect(address);
  if (!one.ok()) return "";
  auto status = one->Status();
  return status.ok() ? status->leadership().state() : "";
}

absl::Status Cluster::StartAgent(int i) {
  const Link& l = links_[i];
  unlink(Socket(i).c_str());  // a killed agent leaves its socket file behind
  agents_[i] = std::make_unique<Process>(
      std::vector<std::string>{"/usr/sbin/ip", "netns", "exec", l.ns,
                               o_.bin_dir + "/daemon/wb-agent", "--config",
                               dir_ + "/" + l.agent + ".yaml"},
      dir_ + "/" + l.agent + ".log");
  const std::string sock = Socket(i);
  if (!wb::testing::WaitUntil([&] { return access(sock.c_str(), F_OK) == 0; },
                              std::chrono::seconds(30))) {
    return absl::UnavailableError(
        absl::StrCat("agent ", l.agent, " did not start (see ", dir_, "/", l.agent, ".log)"));
  }
  return absl::OkStatus();
}

std::vector<std::string> ShapeArgs(const ClusterShape& s) {
  return {"--model",
          s.model,
          "--layers",
          std::to_string(s.layers),
          "--trainer-nodes",
          std::to_string(s.trainer_nodes),
          "--trainer-replicas",
          std::to_string(s.trainer_replicas),
          "--inference-nodes",
          std::to_string(s.inference_nodes),
          "--gpus-per-node",
          std::to_string(s.gpus_per_node)};
}

absl::Status Cluster::StartTrainers() {
  for (int r = 0; r < shape().trainer_ranks(); ++r) {
    const int node = r / shape().gpus_per_node;
    std::vector<std::string> argv = {"/usr/sbin/ip",    "netns",    "exec",      links_[node].ns,
                                     SelfPath(),        "--role",   "trainer",   "--rank",
                                     std::to_string(r), "--socket", Socket(node)};
    for (auto& a : ShapeArgs(shape())) argv.push_back(a);
    trainers_.push_back(
        std::make_unique<Child>(argv, absl::StrCat(dir_, "/trainer-rank-", r, ".log")));
  }
  for (auto& t : trainers_) {
    if (t->ReceiveWithin(kLineTimeout).value_or("").rfind("ready ", 0) != 0) {
      return absl::UnavailableError(
          absl::StrCat("a trainer rank did not register its tensors (see ", dir_, ")"));
    }
  }
  return absl::OkStatus();
}

// The workers on inference node `node` (its index among inference nodes).
std::vector<std::unique_ptr<Child>*> Cluster::WorkersOf(int node) {
  std::vector<std::unique_ptr<Child>*> out;
  for (int g = node * shape().gpus_per_node; g < (node + 1) * shape().gpus_per_node; ++g) {
    out.push_back(&workers_[g]);
  }
  return out;
}

absl::Status Cluster::StartWorkers(int node) {
  const int tp = shape().inference_tp();
  const int agent = shape().trainer_nodes + node;
  workers_.resize(shape().inference_nodes * shape().gpus_per_node);
  worker_bytes_.resize(workers_.size());
  for (int g = node * shape().gpus_per_node; g < (node + 1) * shape().gpus_per_node; ++g) {
    std::vector<std::string> argv = {"/usr/sbin/ip",
                                     "netns",
                                     "exec",
                                     links_[agent].ns,
                                     SelfPath(),
                                     "--role",
                                     "inference",
                                     "--replica",
                                     std::to_string(g / tp),
                                     "--rank",
                                     std::to_string(g % tp),
                                     "--socket",
                                     Socket(agent)};
    for (auto& a : ShapeArgs(shape())) argv.push_back(a);
    workers_[g].reset();
    workers_[g] = std::make_unique<Child>(argv, absl::StrCat(dir_, "/worker-", g, ".log"));
  }
  for (int g = node * shape().gpus_per_node; g < (node + 1) * shape().gpus_per_node; ++g) {
    unsigned long long b = 0;
    if (std::sscanf(workers_[g]->ReceiveWithin(kLineTimeout).value_or("").c_str(), "ready %llu",
                    &b) != 1) {
      return absl::UnavailableError(absl::StrCat("inference worker ", g,
                                                 " did not register its tensors (see ", dir_,
                                                 "/worker-", g, ".log)"));
    }
    worker_bytes_[g] = b;
  }
  return absl::OkStatus();
}

absl::Status Cluster::MakePlan(v1::DeltaChoice delta, v1::RelayChoice relays) {
  auto plan = client_->Plan(world_, std::chrono::seconds(120), delta, relays);
  if (!plan.ok()) return plan.status();
  plan_ = *plan;
  // The planner's rails are what the agents report: each agent's tcp rail is configured at the
  // shaped rate (transports.tcp.gbps), so the plan's prediction needs no rescaling. Read back
  // to show it.
  auto status = client_->Status();
  if (status.ok()) {
    for (const auto& a : status->agents()) {
      for (const auto& nic : a.info().nics()) {
        if (nic.transport() == "tcp" && nic.gbps() > 0) rail_gbps_ = nic.gbps();
      }
    }
  }
  return absl::OkStatus();
}

bool Cluster::RunStep(const std::string& scenario, const std::function<void()>& fault,
                      const std::string& note) {
  const uint32_t v = ++version_;
  last_step_.reset();
  last_error_.clear();
  // The trainer ranks apply version `version` (with --capture, v + 1 while v sends).
  auto train = [&](uint32_t version) {
    for (auto& t : trainers_) t->Send(absl::StrCat("perturb ", version));
    for (auto& t : trainers_) {
      if (t->ReceiveWithin(kLineTimeout).value_or("") != absl::StrCat("ok ", version)) {
        std::printf("FAIL: a trainer rank did not apply version %u\n", version);
        all_verified_ = false;
        return false;
      }
    }
    trained_ = version;
    return true;
  };
  if (trained_ < v && !train(v)) return false;
  std::vector<pid_t> pids{controller_->pid()};
  for (auto& a : agents_) pids.push_back(a->pid());
  double cpu0 = 0;
  for (pid_t p : pids) cpu0 += CpuSeconds(p);
  const auto host0 = HostCpu();
  const auto c0 = net_.Counters();
  const double t0 = Now();
  std::thread fault_thread;
  if (fault) fault_thread = std::thread(fault);
  // --trace-ms: per-link rates through the step, to see where the links sit idle.
  std::atomic<bool> stepping{true};
  std::vector<std::pair<double, std::map<std::string, std::pair<uint64_t, uint64_t>>>> trace;
  std::thread tracer;
  if (o_.trace_ms > 0) {
    tracer = std::thread([&] {
      while (stepping) {
        trace.emplace_back(Now() - t0, net_.Counters());
        std::this_thread::sleep_for(std::chrono::milliseconds(o_.trace_ms));
      }
    });
  }
  absl::StatusOr<v1::StepResult> step;
  if (o_.capture || async_steps_) {
    // As a training loop would (docs/clients.md): once every sender has captured v, the ranks
    // overwrite their weights with v + 1 while v is still on the links; the workers verify v.
    auto handle = client_->StepAsync(v);
    auto captured = handle.WaitCaptured(std::chrono::minutes(5));
    // A rank that fails to train fails this step's report (after the threads below are joined).
    if (captured.ok() && !train(v + 1)) {
      step = absl::InternalError(absl::StrCat("a trainer rank did not apply version ", v + 1));
    } else {
      step = captured.ok() ? handle.Result(std::chrono::minutes(5))
                           : absl::StatusOr<v1::StepResult>(captured.status());
    }
  } else {
    step = client_->Step(v);
  }
  const double wall = Now() - t0;
  stepping = false;
  if (tracer.joinable()) tracer.join();
  if (fault_thread.joinable()) fault_thread.join();
  if (!trace.empty()) {
    std::string head = "   t(s)";
    for (const Link& l : links_)
      absl::StrAppend(&head, " ", l.port, l.port.size() < 3 ? "   " : "  ");
    std::printf("per-link Mbit/s (trainers: out, inference: in):\n%s\n", head.c_str());
    for (size_t k = 1; k < trace.size(); ++k) {
      const double dt = trace[k].first - trace[k - 1].first;
      std::string row = absl::StrCat(Num(trace[k].first, 1));
      while (row.size() < 7) row = " " + row;
      for (const Link& l : links_) {
        const bool out = l.agent.rfind("trainer", 0) == 0;
        auto a = trace[k - 1].second[l.port], b = trace[k].second[l.port];
        const double bytes = out ? b.first - a.first : b.second - a.second;
        std::string cell = Num(bytes * 8 / 1e6 / dt, 0);
        while (cell.size() < 5) cell = " " + cell;
        absl::StrAppend(&row, cell);
      }
      std::printf("%s\n", row.c_str());
    }
  }
  const auto c1 = net_.Counters();
  const auto host1 = HostCpu();
  double cpu1 = 0;
  for (pid_t p : pids) cpu1 += CpuSeconds(p);
  if (!step.ok()) {
    const std::string err(step.status().message());
    last_error_ = err;
    std::printf("\n[%s] version %u FAILED after %.2f s: %s\n", scenario.c_str(), v, wall,
                err.c_str());
    json_.push_back(absl::StrCat("{\"scenario\":", Json(scenario), ",\"agents\":", AgentCount(),
                                 ",\"link_mbit\":", Num(o_.link_mbit, 0), ",\"version\":", v,
                                 ",\"ok\":false,\"error\":", Json(err), ",\"step_seconds\":",
                                 Num(wall), ",\"ideal_seconds\":null,\"efficiency\":null,",
                                 "\"predicted_seconds\":null,\"verified\":false", note, "}"));
    // Surviving workers see abort(v); they say nothing until the next commit.
    return false;
  }
  committed_.push_back(*step);
  const bool delta_step = step->delta_ops() > 0;
  // Bytes per agent: sent from the step, received from the plan (dense), wire from the links.
  std::map<std::string, LinkBytes> per;
  for (const auto& a : step->agents()) per[a.agent()].sent = a.bytes_sent();
  for (const auto& r : plan_.receivers()) per[r.agent()].received = r.bytes();
  double ideal = 0, wire_ideal = 0;
  std::string bottleneck, wire_out_json, wire_in_json;
  wb::client::Table table(
      {"AGENT", "LINK", "SENT", "RECEIVED", "WIRE OUT", "WIRE IN", "LINK-LIMITED s"});
  for (const Link& l : links_) {
    LinkBytes& b = per[l.agent];
    auto d0 = c0.count(l.port) ? c0.at(l.port) : std::pair<uint64_t, uint64_t>{0, 0};
    auto d1 = c1.count(l.port) ? c1.at(l.port) : d0;
    b.wire_out = d1.first - d0.first;
    b.wire_in = d1.second - d0.second;
    b.received_known = !delta_step;
    const double rate = l.mbit * 1e6 / 8;
    const double payload = std::max<double>(b.sent, b.received_known ? b.received : b.wire_in);
    const double busy = payload / rate;
    const double wire_busy = std::max(b.wire_out, b.wire_in) / rate;
    if (busy > ideal) {
      ideal = busy;
      bottleneck = absl::StrCat(l.agent, b.sent >= b.received ? " out" : " in");
    }
    wire_ideal = std::max(wire_ideal, wire_busy);
    table.Add({l.agent, absl::StrCat(Num(l.mbit, 0), " Mbit/s"), HumanBytes(b.sent),
               b.received_known ? HumanBytes(b.received) : "-", HumanBytes(b.wire_out),
               HumanBytes(b.wire_in), Num(busy, 2)});
    absl::StrAppend(&wire_out_json, wire_out_json.empty() ? "" : ",", Json(l.agent), ":",
                    b.wire_out);
    absl::StrAppend(&wire_in_json, wire_in_json.empty() ? "" : ",", Json(l.agent), ":", b.wire_in);
  }
  // The ideal for the capacity the links have now, wherever the plan put the bytes: trainer
  // nodes holding the same shards (node k of every data-parallel copy) may share their bytes
  // in any proportion, so each such group's bytes go at the sum of its rates; each inference
  // agent's bytes at its own rate.
  double capacity_ideal = 0;
  const int copy_nodes = shape().trainer_nodes / shape().trainer_replicas;
  for (int g = 0; g < copy_nodes; ++g) {
    double bytes = 0, rate = 0;
    for (int k = g; k < shape().trainer_nodes; k += copy_nodes) {
      bytes += per[links_[k].agent].sent;
      rate += links_[k].mbit * 1e6 / 8;
    }
    capacity_ideal = std::max(capacity_ideal, bytes / rate);
  }
  for (size_t i = shape().trainer_nodes; i < links_.size(); ++i) {
    const LinkBytes& b = per[links_[i].agent];
    capacity_ideal = std::max(
        capacity_ideal, (b.received_known ? b.received : b.wire_in) / (links_[i].mbit * 1e6 / 8));
  }
  last_step_ = *step;
  last_capacity_ideal_ = capacity_ideal;
  // Every inference worker of a committed replica checks every byte it holds; those of a
  // skipped replica are not asked (they saw abort, or their agent is gone).
  const std::set<int> committed(step->committed_replicas().begin(),
                                step->committed_replicas().end());
  int verified = 0, expected = 0;
  uint64_t checked = 0;
  std::string failure;
  for (size_t g = 0; g < workers_.size(); ++g) {
    if (!committed.empty() && !committed.count(static_cast<int>(g) / shape().inference_tp())) {
      continue;
    }
    ++expected;
    const std::string line = VerifiedLine(g, v, kLineTimeout);
    unsigned long long b = 0;
    if (std::sscanf(line.c_str(), ("verified " + std::to_string(v) + " PASS %llu").c_str(), &b) ==
            1 &&
        b == worker_bytes_[g]) {
      ++verified;
      checked += b;
    } else if (failure.empty()) {
      failure = line.empty() ? absl::StrCat("worker ", g, " exited or did not answer") : line;
      if (b != 0 && b != worker_bytes_[g]) {
        absl::StrAppend(&failure, " (checked ", b, " of ", worker_bytes_[g], " bytes)");
      }
    }
  }
  const bool ok = verified == expected && expected > 0;
  std::string skipped;
  for (const auto& r : step->skipped_replicas()) {
    absl::StrAppend(&skipped, skipped.empty() ? "" : "; ", "replica ", r.replica(), " (",
                    absl::StrJoin(r.agents(), ", "), "): ", r.reason());
  }
  all_verified_ = all_verified_ && ok;
  const double seconds = step->seconds();
  // The controller's prediction made before the step (the delta model's for a delta step).
  const double predicted =
      step->predicted_seconds() > 0 ? step->predicted_seconds() : plan_.predicted_step_seconds();
  if (!step->replanned().empty()) {
    // The controller planned again after this step (links measured off their rating).
    if (auto st = client_->Status(); st.ok() && st->has_plan()) plan_ = st->plan();
  }
  const double cores = (cpu1 - cpu0) / wall;
  const double host_busy = (host1.first - host0.first) / std::max(1.0, host1.second - host0.second);
  const std::string kind = step->delta_anchor() ? "anchor" : (delta_step ? "delta" : "dense");
  std::printf(
      "\n[%s] version %u (%s%s): %s in %.2f s; link-limited ideal %.2f s (%s); "
      "efficiency %.3f; predicted %.2f s (%+.1f%%); trainer held %.3f s (%.3f of the step, %s), "
      "inference paused %.3f s (%.3f); agents used %.2f cores (host %.0f%% "
      "busy); verified %d/%d workers (%s)%s%s%s%s\n%s",
      scenario.c_str(), v, kind.c_str(), note.empty() ? "" : ", see notes",
      HumanBytes(step->bytes()).c_str(), seconds, ideal, bottleneck.c_str(), ideal / seconds,
      predicted, (predicted / seconds - 1) * 100, step->trainer_stall_seconds(),
      step->trainer_stall_seconds() / seconds, step->capture().c_str(),
      step->inference_pause_seconds(), step->inference_pause_seconds() / seconds, cores,
      host_busy * 100, verified, expected, HumanBytes(checked).c_str(),
      ok ? "" : (" MISMATCH: " + failure).c_str(),
      skipped.empty() ? "" : ("; skipped " + skipped).c_str(),
      delta_step ? ("\n  predicted by the " + step->prediction()).c_str() : "",
      step->replanned().empty() ? "" : ("\n  re-planned: " + step->replanned()).c_str(),
      table.Render().c_str());
  std::fflush(stdout);
  json_.push_back(absl::StrCat(
      "{\"scenario\":", Json(scenario), ",\"agents\":", AgentCount(), ",\"link_mbit\":",
      Num(o_.link_mbit, 0), ",\"model\":", Json(shape().model), ",\"layers\":", shape().layers,
      ",\"version\":", v, ",\"ok\":true,\"kind\":", Json(kind), ",\"bytes\":", step->bytes(),
      ",\"bytes_dense\":", step->bytes_dense() ? step->bytes_dense() : step->bytes(),
      ",\"step_seconds\":", Num(seconds), ",\"ideal_seconds\":", Num(ideal),
      ",\"wire_ideal_seconds\":", Num(wire_ideal), ",\"bottleneck\":", Json(bottleneck),
      ",\"efficiency\":", Num(ideal / seconds), ",\"capacity_ideal_seconds\":", Num(capacity_ideal),
      ",\"over_capacity_ideal\":", Num(seconds / capacity_ideal),
      ",\"predicted_seconds\":", Num(predicted), ",\"prediction\":", Json(step->prediction()),
      ",\"replanned\":", Json(step->replanned()), ",\"prediction_error\":",
      Num(predicted / seconds - 1), ",\"agent_cpu_cores\":", Num(cores, 2),
      ",\"host_cpu_busy\":", Num(host_busy, 2), ",\"verified\":", ok ? "true" : "false",
      ",\"verified_bytes\":", checked, ",\"committed_replicas\":", step->committed_replicas_size(),
      ",\"skipped_replicas\":", step->skipped_replicas_size(), ",\"trainer_stall_seconds\":",
      Num(step->trainer_stall_seconds()), ",\"capture\":", Json(step->capture()),
      ",\"inference_pause_seconds\":", Num(step->inference_pause_seconds()),
      ",\"staged_replicas\":",
      std::count_if(step->replica_pauses().begin(), step->replica_pauses().end(),
                    [](const v1::ReplicaPause& p) { return p.staged(); }),
      ",\"trainer_stall_ratio\":", Num(step->trainer_stall_seconds() / seconds),
      ",\"inference_pause_ratio\":", Num(step->inference_pause_seconds() / seconds),
      ",\"wire_out\":{", wire_out_json, "},\"wire_in\":{", wire_in_json, "}", note, "}"));
  return ok;
}

bool Cluster::Scenario(const std::string& name) {
  std::printf("\n=== scenario %s ===\n", name.c_str());
  std::fflush(stdout);
  if (name == "balanced") {
    bool ok = true;
    for (int s = 0; s < o_.steps; ++s) ok = RunStep(name) && ok;
    return ok;
  }
  if (name == "delta") {
    // Dense reference first, then a delta plan: its first step is an anchor, then deltas.
    if (auto s = MakePlan(v1::DELTA_CHOICE_ON); !s.ok()) {
      std::printf("FAIL: delta plan: %s\n", std::string(s.message()).c_str());
      return false;
    }
    std::printf("%s", wb::client::FormatPlan(plan_).c_str());
    bool ok = true;
    for (int s = 0; s < o_.steps + 1; ++s) ok = RunStep(name) && ok;
    if (auto s = MakePlan(v1::DELTA_CHOICE_OFF); !s.ok()) return false;
    return ok;
  }
  if (name == "slow-link") return SlowLinkScenario();
  if (name == "kill") return KillScenario();
  if (name == "failover") return FailoverScenario();
  if (name == "relay") return RelayScenario();
  std::printf("unknown scenario %s (balanced, slow-link, kill, delta, relay, failover, all)\n",
              name.c_str());
  return false;
}

// Relays (issue 30): a quarter of the agents train, three quarters serve (2 -> 6 at 8 agents:
// three replicas of two nodes), so without relays the trainers' links carry three replicas'
// bytes while each inference link takes one replica's half. The same steps planned without
// relays, then with them (the cost model chooses the tree): each step against the
// receiver-limited ideal (the busiest inference link's bytes at its rate), and the speed-up.
// Goals: with relays, efficiency >= 0.85 against that ideal and >= 2x faster than without.
bool Cluster::RelayScenario() {
  auto run = [&](v1::RelayChoice choice, const char* label, std::vector<double>* seconds,
                 double* receiver_ideal) {
    if (auto s = MakePlan(v1::DELTA_CHOICE_OFF, choice); !s.ok()) {
      std::printf("FAIL: plan %s relays: %s\n", label, std::string(s.message()).c_str());
      return false;
    }
    std::printf("plan %s relays:\n%s", label, wb::client::FormatPlan(plan_).c_str());
    bool ok = true;
    for (int s = 0; s < std::max(2, o_.steps); ++s) {
      const bool step_ok = RunStep(
          absl::StrCat("relay-", label), nullptr,
          absl::StrCat(",\"relays\":", Json(label), ",\"relay_roots\":", plan_.relay_roots(),
                       ",\"relay_fanout\":", plan_.relay_fanout()));
      ok = step_ok && ok;
      if (!step_ok || !last_step_) continue;
      seconds->push_back(last_step_->seconds());
      // Each inference link's bytes at its shaped rate (the planner's receiver limit: the
      // agents' tcp rails are rated at that rate): no relay can beat it.
      const double ideal = plan_.receiver_limit_seconds();
      *receiver_ideal = ideal;
    }
    return ok;
  };
  std::vector<double> direct, relayed;
  double ideal_direct = 0, ideal = 0;
  bool ok = run(v1::RELAY_CHOICE_OFF, "off", &direct, &ideal_direct);
  ok = run(v1::RELAY_CHOICE_ON, "on", &relayed, &ideal) && ok;
  if (!ok || direct.empty() || relayed.empty()) {
    std::printf("FAIL: relay scenario: a step failed\n");
    return false;
  }
  // The steps after the first of each plan (the first connects and warms up).
  auto mean_after_first = [](const std::vector<double>& v) {
    double sum = 0;
    for (size_t i = 1; i < v.size(); ++i) sum += v[i];
    return v.size() > 1 ? sum / (v.size() - 1) : v[0];
  };
  const double without = mean_after_first(direct), with = mean_after_first(relayed);
  const double efficiency = ideal / with, speedup = without / with;
  const bool met = efficiency >= 0.85 && speedup >= 2;
  std::printf(
      "\nrelays: %.2f s per step with relays (tree: %d root(s), fan-out %d), %.2f s without; "
      "receiver-limited ideal %.2f s: efficiency %.3f (goal >= 0.85), %.2fx faster than "
      "without relays (goal >= 2x): %s\n",
      with, plan_.relay_roots(), plan_.relay_fanout(), without, ideal, efficiency, speedup,
      met ? "met" : "NOT met");
  json_.push_back(absl::StrCat(
      "{\"scenario\":\"relay\",\"summary\":true,\"agents\":", AgentCount(),
      ",\"link_mbit\":", Num(o_.link_mbit, 0), ",\"step_seconds_with_relays\":", Num(with),
      ",\"step_seconds_without_relays\":", Num(without), ",\"receiver_ideal_seconds\":", Num(ideal),
      ",\"efficiency\":", Num(efficiency), ",\"speedup\":", Num(speedup),
      ",\"relay_roots\":", plan_.relay_roots(), ",\"relay_fanout\":", plan_.relay_fanout(),
      ",\"goals_met\":", met ? "true" : "false", "}"));
  // Later scenarios plan as the config says.
  if (auto s = MakePlan(v1::DELTA_CHOICE_OFF); !s.ok()) return false;
  return true;  // every step verified; the goals are figures, reported above
}

// One trainer agent's link at a quarter of the rate, the planner not told. The controller
// measures it in the first step (controller/link_learning.h) and plans again: with one copy of
// the trainer weights nothing can route around the link (only the prediction changes); with
// data-parallel copies (--trainer-replicas 2) the slow agent's work moves to its copies, and
// from the second step on each step should take at most 1.15x the ideal for the capacity that
// remains. Then the link is restored and one more step lets the controller see it recover.
// Every step must commit and verify before its deadline, and the slow agent's queue never drops.
bool Cluster::SlowLinkScenario() {
  Link& slow = links_[0];
  if (auto s = net_.Shape(slow, o_.link_mbit / 4); !s.ok()) {
    std::printf("FAIL: %s\n", std::string(s.message()).c_str());
    return false;
  }
  const bool copies = shape().trainer_replicas > 1;
  std::printf("%s's link now %.0f Mbit/s (the others %.0f); %d copy(ies) of the trainer weights\n",
              slow.agent.c_str(), slow.mbit, o_.link_mbit, shape().trainer_replicas);
  bool ok = true, replanned = false;
  std::vector<double> over;  // step seconds / the ideal for the capacity that remains
  const int steps = std::max(3, o_.steps);
  for (int s = 0; s < steps; ++s) {
    const auto before = net_.Drops(slow);
    const bool step_ok = RunStep(
        "slow-link", nullptr,
        absl::StrCat(",\"slow_agent\":", Json(slow.agent), ",\"slow_mbit\":", Num(slow.mbit, 0),
                     ",\"trainer_replicas\":", shape().trainer_replicas,
                     ",\"after_slowdown\":", s + 1));
    ok = step_ok && ok;
    if (step_ok && last_step_) {
      over.push_back(last_step_->seconds() / last_capacity_ideal_);
      // With copies, a step on the new plan moves the slow agent's work to its copy holder (a
      // quarter of the rate: about a fifth of their shared bytes, never over half).
      if (copies && replanned) {
        const std::string& partner = links_[shape().trainer_nodes / shape().trainer_replicas].agent;
        uint64_t mine = 0, theirs = 0;
        for (const auto& a : last_step_->agents()) {
          if (a.agent() == slow.agent) mine = a.bytes_sent();
          if (a.agent() == partner) theirs = a.bytes_sent();
        }
        const bool moved = theirs > 0 && mine * 2 < theirs;
        std::printf("on the new plan %s sent %s, its copy %s %s%s\n", slow.agent.c_str(),
                    HumanBytes(mine).c_str(), partner.c_str(), HumanBytes(theirs).c_str(),
                    moved ? "" : " (FAIL: the work did not move off the slow link)");
        ok = ok && moved;
      }
      replanned = replanned || !last_step_->replanned().empty();
    }
    const auto after = net_.Drops(slow);
    const uint64_t dropped = after.first - before.first, aborted = after.second - before.second;
    std::printf(
        "%s's egress queue dropped %llu packet(s) in this step; the kernel aborted %llu of its "
        "TCP connection(s) on a timeout%s\n",
        slow.agent.c_str(), static_cast<unsigned long long>(dropped),
        static_cast<unsigned long long>(aborted),
        dropped || aborted ? " (FAIL: a host queue that drops starves sockets until the kernel "
                             "gives up on them)"
                           : "");
    std::fflush(stdout);
    ok = ok && dropped == 0 && aborted == 0;
  }
  std::string ratios;
  double worst_after_first = 0;
  for (size_t k = 0; k < over.size(); ++k) {
    absl::StrAppend(&ratios, k ? ", " : "", Num(over[k], 2));
    if (k > 0) worst_after_first = std::max(worst_after_first, over[k]);
  }
  std::printf(
      "slow link: step / ideal for the remaining capacity, by step after the slowdown: %s; %s\n",
      ratios.c_str(),
      !replanned ? "the controller did NOT plan again"
      : copies   ? (worst_after_first <= 1.15 ? "from the second step <= 1.15 (goal met)"
                                              : "from the second step > 1.15 (goal MISSED)")
                 : "re-planned (one copy: nothing to route around, the prediction follows)");
  // The controller must have noticed: a step result names the new plan.
  ok = ok && replanned;
  (void)net_.Shape(slow, o_.link_mbit);
  // Recovery: the agent's (now small) share runs at full speed again; the controller forgets
  // the slow estimate and plans again.
  if (RunStep("slow-link", nullptr,
              absl::StrCat(",\"slow_agent\":", Json(slow.agent), ",\"restored\":true"))) {
    std::printf("link restored: %s\n",
                last_step_ && !last_step_->replanned().empty()
                    ? ("the controller planned again (" + last_step_->replanned() + ")").c_str()
                    : "no re-plan after this step");
  } else {
    ok = false;
  }
  return ok;
}

std::string Cluster::VerifiedLine(size_t g, uint32_t v, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    std::optional<std::string> line = workers_[g]->ReceiveWithin(left);
    if (!line) return "";
    if (line->rfind("aborted ", 0) == 0) continue;
    unsigned u = 0;
    if (std::sscanf(line->c_str(), "verified %u ", &u) == 1 && u < v) continue;  // an older one
    return *line;
  }
}

// SIGKILL one inference agent 40% into a step. With two or more replicas (the elastic fleet,
// docs/elastic.md) the step commits to the others and lists the victim's replica as skipped;
// with one replica there is nothing to commit to and the step fails naming the victim. Then
// the agent and its workers are restarted, and within a few steps the replica catches up: a
// step commits to every replica and every worker verifies every byte. Every wait is bounded.
bool Cluster::KillScenario() {
  const int node = shape().inference_nodes > 1 ? 1 : 0;
  const int agent = shape().trainer_nodes + node;
  const std::string victim = links_[agent].agent;
  const int tp = shape().inference_tp();
  std::set<int> victim_replicas;
  for (int g = node * shape().gpus_per_node; g < (node + 1) * shape().gpus_per_node; ++g) {
    victim_replicas.insert(g / tp);
  }
  const bool elastic = shape().inference_replicas() > static_cast<int>(victim_replicas.size());
  const double predicted = plan_.predicted_step_seconds();
  const double delay = std::max(0.3, 0.4 * predicted);
  double killed_at = 0;
  const double t0 = Now();
  const bool committed = RunStep(
      "kill",
      [&] {
        std::this_thread::sleep_for(std::chrono::duration<double>(delay));
        killed_at = Now();
        agents_[agent]->Signal(SIGKILL);
      },
      absl::StrCat(",\"killed\":", Json(victim), ",\"killed_after_seconds\":", Num(delay, 2)));
  const double answered_after = Now() - killed_at;
  bool ok = true;
  if (elastic) {
    // The step commits to the healthy replicas; the victim's are listed as skipped, naming it.
    bool listed = false;
    if (last_step_) {
      for (const auto& r : last_step_->skipped_replicas()) {
        const bool names =
            std::find(r.agents().begin(), r.agents().end(), victim) != r.agents().end() ||
            r.reason().find(victim) != std::string::npos;
        listed = listed || (victim_replicas.count(r.replica()) && names);
      }
    }
    std::printf(
        "killed %s %.2f s into the step; the step %s %.2f s after the kill; its replica %s "
        "listed as skipped\n",
        victim.c_str(), delay,
        committed    ? "committed to the other replica(s)"
        : last_step_ ? "committed but did not verify"
                     : ("FAILED (" + last_error_ + ")").c_str(),
        answered_after, listed ? "is" : "is NOT");
    ok = committed && listed;
  } else {
    // One replica: nothing is left to commit to.
    const bool named = !committed && last_error_.find(victim) != std::string::npos;
    std::printf(
        "killed %s %.2f s into the step (the only replica); the step %s %.2f s after the kill; "
        "error %s the agent\n",
        victim.c_str(), delay, committed ? "COMMITTED (unexpected)" : "failed", answered_after,
        named ? "names" : "does NOT name");
    ok = named;
  }
  // The victim's workers lost their agent and exit ("gone ..."): bounded, never blocking.
  for (auto* w : WorkersOf(node)) (void)(*w)->ReceiveWithin(std::chrono::seconds(10));
  const double r0 = Now();
  auto s = StartAgent(agent);
  if (s.ok()) s = StartWorkers(node);
  if (!s.ok()) {
    std::printf("FAIL: restart: %s\n", std::string(s.message()).c_str());
    return false;
  }
  std::printf("restarted %s and its %d workers in %.2f s (%.2f s after the kill)\n", victim.c_str(),
              shape().gpus_per_node, Now() - r0, Now() - t0 - delay);
  // Catch-up: the controller re-plans on the changed layout; until the restarted agent's layout
  // is in, a step skips its replica (or, with one replica, fails). Within 20 steps one must
  // commit to every replica, every worker verifying.
  bool caught_up = false;
  int attempts = 0;
  for (; attempts < 20 && !caught_up; ++attempts) {
    const bool step_ok =
        RunStep("kill", nullptr, absl::StrCat(",\"after_restart_of\":", Json(victim)));
    caught_up = step_ok && last_step_ &&
                last_step_->committed_replicas_size() == shape().inference_replicas();
    if (!caught_up) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::printf("after the restart: %s %s in %d step(s)\n", victim.c_str(),
              caught_up ? "caught up (every replica committed and verified)" : "did NOT catch up",
              attempts);
  auto status = client_->Status();
  if (status.ok() && status->has_plan()) plan_ = status->plan();
  return ok && caught_up;
}

// Controller failover (issue 45): the leader's namespace is cut 40% into a step (nothing
// reaches it: not etcd, not the agents, not the client). It steps down before its lease can
// expire, the standby leads, the client's step is retried there and commits (every worker
// verifying), and the next steps run on the new leader. Then the old leader's namespace is
// joined back: it stands by. Figures: the time without a leader and the step across the cut.
bool Cluster::FailoverScenario() {
  if (!o_.ha) {
    std::printf("FAIL: the failover scenario needs the controllers in high availability\n");
    return false;
  }
  bool ok = RunStep("failover");
  // a leads: cut it (the client's Step fails over to b); then, with a back as a standby, cut b
  // with the step started through StepAsync (the training loop's call: it fails over too while
  // no sender has captured, and in place they capture only at the end).
  const Failover first = CutLeader("a", "ca", CtlA(), CtlB());
  ok = ok && first.ok;
  async_steps_ = true;
  const Failover second = CutLeader("b", "cb", CtlB(), CtlA());
  async_steps_ = false;
  ok = ok && second.ok;
  json_.push_back(absl::StrCat(
      "{\"scenario\":\"failover\",\"summary\":true,\"agents\":", AgentCount(),
      ",\"lease_ttl_seconds\":", Num(o_.lease_ttl_ms / 1000.0, 1), ",\"leaderless_seconds\":",
      Num(first.leaderless, 3), ",\"step_across_cut_seconds\":", Num(first.committed_after, 3),
      ",\"committed\":", first.committed ? "true" : "false",
      ",\"old_leader_stands_by\":", first.stands_by ? "true" : "false",
      ",\"back_leaderless_seconds\":", Num(second.leaderless, 3),
      ",\"back_step_across_cut_seconds\":", Num(second.committed_after, 3),
      ",\"back_committed\":", second.committed ? "true" : "false", "}"));
  return ok;
}

Cluster::Failover Cluster::CutLeader(const std::string& name, const std::string& ns,
                                     const std::string& leader, const std::string& standby) {
  Failover f;
  const double delay = std::max(0.3, 0.4 * plan_.predicted_step_seconds());
  double cut_at = 0;
  f.committed = RunStep(
      "failover",
      [&] {
        std::this_thread::sleep_for(std::chrono::duration<double>(delay));
        cut_at = Now();
        bool down = false;
        Run("ip -n " + net_.Ns(ns) + " link set eth0 down", &down);
        if (!down) return;
        if (wb::testing::WaitUntil([&] { return StateOf(standby) == "leader"; },
                                   std::chrono::seconds(60))) {
          f.leaderless = Now() - cut_at;
        }
      },
      absl::StrCat(",\"cut\":\"controller ", name, "\",\"cut_after_seconds\":", Num(delay, 2),
                   ",\"step_async\":", async_steps_ ? "true" : "false"));
  f.committed_after = Now() - cut_at;
  const double ttl = o_.lease_ttl_ms / 1000.0;
  std::printf(
      "[failover] cut controller %s's namespace %.2f s into version %u (%s); the standby leads "
      "%.2f s after the cut (lease TTL %.1f s); the step %s %.2f s after the cut\n",
      name.c_str(), delay, version_, async_steps_ ? "StepAsync" : "Step", f.leaderless, ttl,
      f.committed ? "committed on the new leader, every worker verified" : "FAILED",
      f.committed_after);
  bool ok = f.committed && f.leaderless >= 0 && f.leaderless <= 2 * ttl + 1;
  for (int s = 0; s < o_.steps; ++s) ok = RunStep("failover", nullptr, ",\"after_cut\":true") && ok;
  bool up = false;
  Run("ip -n " + net_.Ns(ns) + " link set eth0 up", &up);
  f.stands_by = up && wb::testing::WaitUntil([&] { return StateOf(leader) == "standby"; },
                                             std::chrono::seconds(30));
  std::printf("[failover] controller %s joined back: %s\n", name.c_str(),
              f.stands_by ? "stands by" : "did NOT stand by");
  f.ok = ok && f.stands_by && RunStep("failover", nullptr, ",\"after_rejoin\":true");
  return f;
}

int Cluster::Main() {
  dir_ = wb::testing::TempDir("wb-cluster-");
  auto model = wb::cluster::BuildClusterModel(shape());
  if (!model.ok()) {
    std::printf("FAIL: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const auto node_bytes = wb::cluster::InferenceNodeBytes(*model, shape());
  uint64_t total = 0, busiest = 0;
  for (uint64_t b : node_bytes) total += b, busiest = std::max(busiest, b);
  const double link_bps = o_.link_mbit * 1e6 / 8;
  std::printf(
      "weightbeam cluster in miniature: %d agents (%d trainer nodes x %d ranks, %d data-parallel "
      "copy(ies), EP %d each; %d "
      "inference nodes x %d ranks, %d replicas of TP %d / EP 2, FP8), each in its own network "
      "namespace on %s.0/24, links shaped to %.0f Mbit/s both ways (tc tbf)\n"
      "model %s, %d layers (%.2f B params): one step moves %s into the inference side, %.1f "
      "link-seconds in total (>= 20 asked), the busiest inference link %.1f s\nlogs in %s\n",
      AgentCount(), shape().trainer_nodes, shape().gpus_per_node, shape().trainer_replicas,
      shape().trainer_nodes / std::max(1, shape().trainer_replicas), shape().inference_nodes,
      shape().gpus_per_node, shape().inference_replicas(), shape().inference_tp(),
      o_.subnet.c_str(), o_.link_mbit, shape().model.c_str(), shape().layers,
      model->spec.Params() / 1e9, HumanBytes(total).c_str(), total / link_bps, busiest / link_bps,
      dir_.c_str());
  std::fflush(stdout);

  const double t_setup = Now();
  if (auto s = SetUp(); !s.ok()) {
    std::printf("FAIL: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  auto s = StartTrainers();
  for (int node = 0; s.ok() && node < shape().inference_nodes; ++node) s = StartWorkers(node);
  if (!s.ok()) {
    std::printf("FAIL: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  auto client = wb::client::ControllerClient::Connect(Ctl());
  if (!client.ok()) {
    std::printf("FAIL: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  client_ = std::make_unique<wb::client::ControllerClient>(std::move(*client));
  world_.set_trainer_ranks(shape().trainer_ranks());
  world_.set_inference_replicas(shape().inference_replicas());
  world_.set_inference_ranks_per_replica(shape().inference_tp());
  if (auto p = MakePlan(v1::DELTA_CHOICE_OFF); !p.ok()) {
    std::printf("FAIL: planning: %s\n", std::string(p.message()).c_str());
    return 1;
  }
  std::printf("started and registered in %.1f s\n\n%s", Now() - t_setup,
              wb::client::FormatPlan(plan_).c_str());
  // The agents were configured at the shaped rate; a rail reporting anything else would make
  // every prediction below wrong by that factor.
  const double shaped_gbps = o_.link_mbit / 8000.0;
  if (std::fabs(rail_gbps_ - shaped_gbps) > 1e-6 * shaped_gbps) {
    std::printf(
        "FAIL: the tcp rails report %.6g GB/s to the planner, the links are shaped to %.6g\n",
        rail_gbps_, shaped_gbps);
    return 1;
  }
  std::printf(
      "(the tcp rails report %.4g GB/s to the planner, the shaped %.0f Mbit/s, from "
      "transports.tcp.gbps; predictions are the planner's own)\n",
      rail_gbps_, o_.link_mbit);
  std::fflush(stdout);

  bool pass = true;
  for (const auto& sc : o_.scenarios) pass = Scenario(sc) && pass;

  // Let the children go before the summary.
  trainers_.clear();
  workers_.clear();
  std::printf("\n%s: scenarios %s at %d agents, %.0f Mbit/s links\n", pass ? "PASS" : "FAIL",
              absl::StrJoin(o_.scenarios, ", ").c_str(), AgentCount(), o_.link_mbit);
  if (!o_.json_out.empty()) {
    std::ofstream f(o_.json_out, std::ios::app);
    for (const auto& j : json_) f << j << "\n";
  }
  for (const auto& j : json_) std::printf("%s\n", j.c_str());
  if (!o_.timeline.empty() && !committed_.empty()) {
    std::ofstream f(o_.timeline);
    f << wb::client::StepTraceJson(committed_);
    std::printf(f.good() ? "timeline of the %zu committed steps: %s (ui.perfetto.dev)\n"
                         : "(could not write the timeline of %zu steps to %s)\n",
                committed_.size(), o_.timeline.c_str());
  }
  std::fflush(stdout);
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wb-cluster: weightbeam on a cluster in miniature (run by tests/cluster/cluster.sh)"};
  std::string role = "driver", socket, scenario = "balanced";
  Options o;
  int rank = 0, replica = 0, agents = 8;
  o.link_mbit = 200;
  o.shape.layers = 0;
  app.add_option("--role", role, "driver | trainer | inference (internal)");
  app.add_option("--rank", rank, "(internal)");
  app.add_option("--replica", replica, "(internal)");
  app.add_option("--socket", socket, "(internal)");
  app.add_option("--model", o.shape.model, "k2-mini | k2-tiny");
  app.add_option("--layers", o.shape.layers, "decoder layers; 0: sized to --link-seconds");
  app.add_option("--link-seconds", o.link_seconds,
                 "auto-sized model: seconds the busiest link carries per step");
  app.add_option("--agents", agents, "agents, half trainer nodes and half inference nodes");
  app.add_option("--trainer-nodes", o.shape.trainer_nodes, "(internal)");
  app.add_option("--trainer-replicas", o.shape.trainer_replicas,
                 "data-parallel copies of the trainer weights, each on its own trainer nodes "
                 "(the slow-link scenario routes around a slow link through them)");
  app.add_option("--inference-nodes", o.shape.inference_nodes, "(internal)");
  app.add_option("--gpus-per-node", o.shape.gpus_per_node, "ranks per agent");
  app.add_option("--link-mbit", o.link_mbit, "link rate, Mbit/s each way");
  app.add_option("--steps", o.steps, "steps per scenario");
  app.add_option("--scenario", scenario,
                 "balanced | slow-link | kill | delta | relay | failover | all (comma list; relay: "
                 "a quarter of the agents train; failover: two controllers and etcd, the "
                 "leader's namespace cut mid-step)");
  app.add_option("--ns-prefix", o.prefix, "network namespace prefix (made by cluster.sh)");
  app.add_option("--subnet", o.subnet, "the /24 inside the namespaces, e.g. 10.213.0");
  app.add_option("--bin-dir", o.bin_dir, "where wb-agent and wb-controller are");
  app.add_option("--switch-queue-ms", o.switch_queue_ms,
                 "queue of a switch port toward an agent, in ms of the link rate");
  app.add_option("--trace-ms", o.trace_ms, "print per-link rates every N ms during steps");
  app.add_option("--json-out", o.json_out, "also append the JSON lines to this file");
  app.add_flag("--capture", o.capture,
               "trainer agents capture each step and send from the capture (capture.max_bytes)");
  app.add_flag("--staged", o.staged,
               "inference agents stage each step and swap at commit (receive.mode staged)");
  app.add_option("--timeline", o.timeline,
                 "write the committed steps as a Chrome/Perfetto trace (JSON) to this file");
  CLI11_PARSE(app, argc, argv);
  if (role == "trainer") return wb::cluster::RunTrainer(o.shape, rank, socket);
  if (role == "inference") return wb::cluster::RunInference(o.shape, replica, rank, socket);
  signal(SIGPIPE, SIG_IGN);
  if (agents < 4 || agents % 4 != 0) {
    std::fprintf(stderr,
                 "--agents must be a multiple of 4 (half trainer, half inference "
                 "nodes; an inference replica spans two nodes)\n");
    return 2;
  }
  if (o.prefix.empty()) {
    std::fprintf(stderr, "run through tests/cluster/cluster.sh (./wb cluster)\n");
    return 2;
  }
  o.shape.trainer_nodes = o.shape.inference_nodes = agents / 2;
  if (scenario == "relay") {
    // More inference replicas than the trainers can feed: a quarter of the agents train.
    o.shape.trainer_nodes = agents / 4;
    o.shape.inference_nodes = agents - agents / 4;
  }
  if (o.bin_dir.empty()) o.bin_dir = "bazel-bin";
  if (scenario == "all") scenario = "balanced,delta,slow-link,kill";
  o.ha = scenario.find("failover") != std::string::npos;
  std::stringstream ss(scenario);
  for (std::string s; std::getline(ss, s, ',');) o.scenarios.push_back(s);
  if (o.shape.layers == 0) {
    // The smallest layer count whose busiest inference link carries >= link_seconds per step.
    const double link_bps = o.link_mbit * 1e6 / 8;
    for (int l = 2; l <= 512; ++l) {
      o.shape.layers = l;
      auto m = wb::cluster::BuildClusterModel(o.shape);
      if (!m.ok()) {
        std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
        return 2;
      }
      auto bytes = wb::cluster::InferenceNodeBytes(*m, o.shape);
      if (*std::max_element(bytes.begin(), bytes.end()) >= o.link_seconds * link_bps) break;
    }
  }
  Cluster cluster(o);
  return cluster.Main();
}
