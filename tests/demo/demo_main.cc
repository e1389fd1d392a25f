// wb-demo: the whole system on one machine. Starts a controller and two agents (a "trainer
// node" and an "inference node"), synthetic trainer ranks (Hugging Face FSDP shards) and vLLM
// TP workers of Qwen3-0.6B registered through the engines API, plans, runs steps in which the
// trainers change their weights, and has every inference worker verify its parameters bit for
// bit after each commit.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/report_format.h"
#include "client/step_trace.h"
#include "client/table.h"
#include "client/weightbeam/controller_client.h"
#include "tests/demo/demo_roles.h"
#include "tests/demo/gpu_buffers.h"
#include "tests/demo/line_child.h"
#include "tests/support/process.h"

namespace v1 = weightbeam::v1;
using wb::testing::Process;

namespace {

using Child = wb::demo::LineChild;  // speaks the line protocol on its stdin/stdout
using wb::demo::SelfPath;

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// `metrics_port` 0: no /metrics.
std::string MetricsYaml(int metrics_port) {
  return metrics_port ? absl::StrCat("metrics_listen: 127.0.0.1:", metrics_port, "\n") : "";
}

std::string AgentYaml(const std::string& name, const std::string& dir, int port, int ctl_port,
                      const std::string& transport, const std::string& rdma_device,
                      int metrics_port, int streams, const std::string& extra) {
  std::string y =
      absl::StrCat("name: ", name, "\nlog_level: warn\nlocal_socket: ", dir, "/", name,
                   ".sock\nlisten: 127.0.0.1:", port, "\ncontroller: 127.0.0.1:", ctl_port,
                   "\nheartbeat_interval_ms: 200\n", MetricsYaml(metrics_port),
                   "transports:\n  tcp:\n    listen: 127.0.0.1:0\n");
  if (streams > 0) y += absl::StrCat("    connections_per_peer: ", streams, "\n");
  if (transport == "rdma") {
    y += absl::StrCat("  rdma:\n    enabled: true\n    devices: [", rdma_device, "]\n");
  }
  y += "executor:\n  staging_watermark_bytes: 256MiB\n";
  return y + extra;
}

// --json: the steps' figures as one line (plan_bench-style). The first step (connections, page
// faults) is listed but left out of min / median.
std::string StepsJson(const wb::demo::DemoShape& shape, const std::string& transport, int streams,
                      const std::vector<v1::StepResult>& results, bool pass) {
  nlohmann::json j = {{"bench", "wb-demo"},      {"model", "qwen3-0.6b"},
                      {"layers", shape.layers},  {"trainers", shape.trainers},
                      {"tp", shape.tp},          {"destinations", shape.bf16 ? "bf16" : "fp8"},
                      {"transport", transport},  {"streams", streams},
                      {"steps", results.size()}, {"verified", pass}};
  std::vector<double> seconds, timed;
  for (const auto& r : results) seconds.push_back(r.seconds());
  timed.assign(seconds.begin() + (seconds.size() > 1 ? 1 : 0), seconds.end());
  std::sort(timed.begin(), timed.end());
  j["seconds_per_step"] = seconds;
  if (!results.empty()) {
    const v1::StepResult& last = results.back();
    const double bytes = static_cast<double>(last.bytes());
    const double min = timed.front(), median = timed[timed.size() / 2];
    j["bytes_per_step"] = last.bytes();
    j["seconds_min"] = min;
    j["seconds_median"] = median;
    j["gbps_best"] = bytes / min / 1e9;
    j["gbps_median"] = bytes / median / 1e9;
    nlohmann::json agents = nlohmann::json::array();
    for (const auto& a : last.agents()) {
      agents.push_back({{"agent", a.agent()},
                        {"ops", a.ops()},
                        {"seconds", a.seconds()},
                        {"stage_in_seconds", a.stages().stage_in_seconds()},
                        {"prepare_seconds", a.stages().prepare_seconds()},
                        {"write_seconds", a.stages().write_seconds()},
                        {"peak_staging_bytes", a.stages().peak_staging_bytes()}});
    }
    j["last_step_senders"] = agents;
  }
  double load[3] = {-1, -1, -1};
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    std::fclose(f);
  }
  j["loadavg"] = {load[0], load[1], load[2]};
  return j.dump() + "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wb-demo: weightbeam end to end on one machine"};
  std::string role = "driver", socket, transport = "tcp", rdma_device = "rxe0", bin_dir;
  wb::demo::DemoShape shape;
  int rank = 0, steps = 3, hold_seconds = 0, streams = 0;
  bool delta = false, gpu = false, capture = false, staged = false, json = false;
  std::vector<int> metrics_ports;
  app.add_option("--role", role, "driver | trainer | inference (internal)");
  app.add_option("--rank", rank, "rank of a trainer or inference worker (internal)");
  app.add_option("--socket", socket, "agent socket of a trainer or inference worker (internal)");
  app.add_option("--transport", transport, "tcp or rdma")->check(CLI::IsMember({"tcp", "rdma"}));
  app.add_option("--rdma-device", rdma_device, "RDMA device for --transport=rdma");
  app.add_option("--layers", shape.layers, "decoder layers (Qwen3-0.6B has 28)");
  app.add_option("--trainers", shape.trainers, "trainer ranks (FSDP dim-0 shards)");
  app.add_option("--tp", shape.tp, "tensor-parallel ranks of the inference replica");
  app.add_option("--steps", steps, "training steps to push");
  app.add_flag("--bf16", shape.bf16,
               "the replica holds BF16 parameters (no FP8 quantization_config): a plain copy "
               "of every byte the trainers hold");
  app.add_option("--streams", streams,
                 "tcp connections per peer (transports.tcp.connections_per_peer; default the "
                 "agent's)");
  app.add_flag("--json", json,
               "print one JSON line of the steps' figures alone on stdout (the tables go to "
               "stderr): tests/bench/bf16_step_bench.sh reads it");
  app.add_flag("--delta", delta, "delta mode: send only changed elements (verification on)");
  app.add_flag("--gpu", gpu,
               "trainer and inference tensors in GPU memory (CUDA device 0, registered through "
               "CUDA IPC); exits 3 when there is no usable GPU");
  app.add_flag("--capture", capture,
               "the trainer agent captures each step (capture.max_bytes) and the trainers move "
               "on to the next version while it sends");
  app.add_flag("--staged", staged,
               "the inference agent stages each step and swaps it in at commit "
               "(receive.mode staged)");
  app.add_option("--bin-dir", bin_dir, "where wb-agent and wb-controller are (default bazel-bin)");
  app.add_option("--metrics-ports", metrics_ports,
                 "serve /metrics on 127.0.0.1: controller,trainer-node,inference-node ports")
      ->delimiter(',')
      ->expected(3);
  std::string trace_file;
  app.add_option("--trace", trace_file,
                 "write the steps as a Chrome/Perfetto trace (JSON) to this file (wbctl trace)");
  app.add_option("--hold-seconds", hold_seconds,
                 "after the steps, keep every process up this long (or until SIGTERM/SIGINT), "
                 "e.g. for a metrics scraper");
  CLI11_PARSE(app, argc, argv);
  // With --json the tables go to stderr and stdout keeps the JSON line alone.
  const int json_fd = json && role == "driver" ? ::dup(STDOUT_FILENO) : -1;
  if (json_fd >= 0) ::dup2(STDERR_FILENO, STDOUT_FILENO);
  if (role == "trainer") return wb::demo::RunTrainer(shape, rank, socket, gpu);
  if (role == "inference") return wb::demo::RunInference(shape, rank, socket, gpu);
  signal(SIGPIPE, SIG_IGN);
  if (gpu) {
    // Said before anything starts, in words ./wb gpu-check recognises (with the exit code).
    if (auto s = wb::demo::GpuDemoAvailable(); !s.ok()) {
      std::printf("no GPU: %s; wb-demo --gpu needs a CUDA device (nothing was run)\n",
                  std::string(s.message()).c_str());
      return wb::demo::kNoGpuExitCode;
    }
  }

  if (const std::string cut =
          shape.bf16 ? std::string()
                     : wb::demo::Fp8BlockCut(wb::demo::DemoQwen3(shape), shape.trainers);
      !cut.empty()) {
    std::printf(
        "FAIL: --trainers %d: torch.chunk cuts %s, inside a 128x128 FP8 block (each block "
        "comes from one trainer); pick a count whose chunks are multiples of 128 rows (1, 2, 4 "
        "or 8 for Qwen3-0.6B; nothing was run)\n",
        shape.trainers, cut.c_str());
    return 1;
  }
  if (bin_dir.empty()) bin_dir = "bazel-bin";
  const std::string dir = wb::testing::TempDir("wb-demo-");
  const int ctl_port = wb::testing::FreePort();
  std::printf(
      "weightbeam demo: Qwen3-0.6B (%d layers), %d trainer ranks (FSDP dim-0 shards, BF16, "
      "HF names) -> 1 vLLM replica x TP %d (its parameters: qkv_proj / gate_up_proj per rank, "
      "%s), transport %s%s\nlogs in %s\n\n",
      shape.layers, shape.trainers, shape.tp,
      shape.bf16 ? "every one BF16" : "FP8 128x128 block-scaled linears + BF16", transport.c_str(),
      gpu ? ", every buffer in GPU memory (cuda:0)" : "", dir.c_str());
  std::fflush(stdout);

  WriteFile(dir + "/controller.yaml",
            absl::StrCat("listen: 127.0.0.1:", ctl_port,
                         "\nlog_level: warn\nheartbeat_timeout_ms: 3000\nworld:\n  trainer_ranks: ",
                         shape.trainers,
                         "\n  inference_replicas: 1\n  inference_ranks_per_replica: ", shape.tp,
                         "\n", MetricsYaml(metrics_ports.empty() ? 0 : metrics_ports[0]),
                         delta ? "delta:\n  enabled: true\n  verify: true\n" : ""));
  Process controller({bin_dir + "/controller/wb-controller", "--config", dir + "/controller.yaml"},
                     dir + "/controller.log");
  std::vector<std::unique_ptr<Process>> agents;
  for (const char* name : {"trainer-node", "inference-node"}) {
    int port = wb::testing::FreePort();
    int metrics_port = metrics_ports.empty() ? 0 : metrics_ports[agents.size() + 1];
    WriteFile(dir + "/" + name + ".yaml",
              AgentYaml(name, dir, port, ctl_port, transport, rdma_device, metrics_port, streams,
                        std::string(name) == "trainer-node"
                            ? (capture ? "capture:\n  max_bytes: 16GiB\n" : "")
                            : (staged ? "receive:\n  mode: staged\n" : "")));
    agents.push_back(
        std::make_unique<Process>(std::vector<std::string>{bin_dir + "/daemon/wb-agent", "--config",
                                                           dir + "/" + name + ".yaml"},
                                  dir + "/" + name + ".log"));
  }
  for (const char* name : {"trainer-node", "inference-node"}) {
    std::string sock = dir + "/" + name + ".sock";
    if (!wb::testing::WaitUntil([&] { return access(sock.c_str(), F_OK) == 0; },
                                std::chrono::seconds(20))) {
      std::printf("FAIL: agent %s did not start (see %s/%s.log)\n", name, dir.c_str(), name);
      return 1;
    }
  }

  const auto t_reg = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Child>> trainers, workers;
  const std::string self = SelfPath();
  // One synthetic process: its role, rank and agent socket, and the demo's shape.
  auto child = [&](const std::string& role, int r, const std::string& node) {
    std::vector<std::string> argv{self,
                                  "--role",
                                  role,
                                  "--rank",
                                  std::to_string(r),
                                  "--socket",
                                  dir + "/" + node + ".sock",
                                  "--layers",
                                  std::to_string(shape.layers),
                                  "--trainers",
                                  std::to_string(shape.trainers),
                                  "--tp",
                                  std::to_string(shape.tp)};
    if (gpu) argv.push_back("--gpu");
    if (shape.bf16) argv.push_back("--bf16");
    return std::make_unique<Child>(argv, dir + "/" + role + "-" + std::to_string(r) + ".log");
  };
  for (int r = 0; r < shape.trainers; ++r) trainers.push_back(child("trainer", r, "trainer-node"));
  for (int r = 0; r < shape.tp; ++r) workers.push_back(child("inference", r, "inference-node"));
  double src_bytes = 0, dst_bytes = 0;
  for (auto* group : {&trainers, &workers}) {
    for (auto& c : *group) {
      std::string line = c->Receive();
      unsigned long long b = 0;
      if (std::sscanf(line.c_str(), "ready %llu", &b) != 1) {
        // A failed process says why in an "error WHO: WHY" line.
        std::printf("FAIL: a synthetic process did not register its tensors%s%s\n",
                    line.rfind("error ", 0) == 0 ? ": " : "",
                    line.rfind("error ", 0) == 0 ? line.c_str() + 6 : "");
        return 1;
      }
      (group == &trainers ? src_bytes : dst_bytes) += static_cast<double>(b);
    }
  }
  std::printf("registered: trainers hold %s (BF16), inference workers %s; %.1f s\n",
              wb::client::HumanBytes(src_bytes).c_str(), wb::client::HumanBytes(dst_bytes).c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_reg).count());

  auto client = wb::client::ControllerClient::Connect(absl::StrCat("127.0.0.1:", ctl_port));
  v1::ExpectedWorld world;
  world.set_trainer_ranks(shape.trainers);
  world.set_inference_replicas(1);
  world.set_inference_ranks_per_replica(shape.tp);
  auto plan = client->Plan(world, std::chrono::seconds(30));
  if (!plan.ok()) {
    std::printf("FAIL: planning: %s\n", std::string(plan.status().message()).c_str());
    return 1;
  }
  std::printf("\n%s\n", wb::client::FormatPlan(*plan).c_str());

  // HELD: how long the trainer waited for the step (until captured, or all of it in place);
  // PAUSED: how long the replica's live tensors were being written (the swap, or all of it).
  std::printf("%-8s  %-12s  %-8s  %-6s  %-14s  %-14s  %s\n", "VERSION", "BYTES", "SECONDS", "GB/s",
              "TRAINER HELD", "INFER. PAUSED",
              delta ? "VERIFIED      DELTA: DENSE BYTES, KIND" : "VERIFIED");
  bool pass = true;
  std::string failure;
  v1::StepResult last;
  std::vector<v1::StepResult> results;
  // The trainers apply version v (their optimizer step); false when one did not.
  auto train = [&](int v) {
    for (auto& t : trainers) t->Send(absl::StrCat("perturb ", v));
    bool ok = true;
    for (auto& t : trainers) ok = t->Receive() == absl::StrCat("ok ", v) && ok;
    if (!ok) failure = "a trainer did not apply its update";
    return ok;
  };
  for (int v = 1; v <= steps && pass; ++v) {
    // With --capture the trainers already moved to v while v - 1 was sending.
    if ((!capture || v == 1) && !(pass = train(v))) break;
    absl::StatusOr<v1::StepResult> step;
    if (capture) {
      // The training loop of docs/clients.md: once every sender has captured v, the trainers
      // overwrite their weights with v + 1 while v is still on its way; the workers still
      // verify v, bit for bit.
      auto handle = client->StepAsync(v);
      auto captured = handle.WaitCaptured(std::chrono::minutes(2));
      if (captured.ok() && v < steps && !(pass = train(v + 1))) break;
      step = !captured.ok() ? absl::StatusOr<v1::StepResult>(captured.status())
                            : handle.Result(std::chrono::minutes(2));
    } else {
      step = client->Step(v);
    }
    if (!step.ok()) {
      pass = false;
      failure = std::string(step.status().message());
      break;
    }
    // The modes asked for are the ones that ran: a capture step says so, and a staged replica's
    // pause is its swap.
    if (capture && step->capture().rfind("captured", 0) != 0) {
      pass = false;
      failure = absl::StrCat("step ", v, " was not captured (", step->capture(), ")");
    }
    for (const auto& p : step->replica_pauses()) {
      if (p.staged() != staged) {
        pass = false;
        failure = absl::StrCat("replica ", p.replica(), " was ", p.staged() ? "" : "not ",
                               "staged in step ", v);
      }
    }
    std::string verdict = "all workers";
    for (auto& w : workers) {
      std::string line = w->Receive();
      if (line.rfind(absl::StrCat("verified ", v, " PASS"), 0) != 0) {
        pass = false;
        verdict = "MISMATCH";
        failure = line.empty() ? "an inference worker exited" : line;
      }
    }
    std::string delta_cols;
    if (delta) {
      delta_cols = absl::StrCat("   ", wb::client::HumanBytes(step->bytes_dense()), ", ",
                                step->delta_anchor() ? "anchor" : "delta");
    }
    // A share of the step, next to the seconds: the goal is a small one.
    auto share = [&](double seconds) {
      return absl::StrCat(wb::client::FixedPoint(seconds), " (",
                          wb::client::FixedPoint(seconds / step->seconds(), 2), ")");
    };
    std::printf("%-8d  %-12s  %-8s  %-6s  %-14s  %-14s  %-11s%s\n", v,
                wb::client::HumanBytes(step->bytes()).c_str(),
                wb::client::FixedPoint(step->seconds()).c_str(),
                wb::client::FixedPoint(step->bytes() / step->seconds() / 1e9, 2).c_str(),
                share(step->trainer_stall_seconds()).c_str(),
                share(step->inference_pause_seconds()).c_str(), verdict.c_str(),
                delta_cols.c_str());
    std::fflush(stdout);
    last = *step;
    results.push_back(*step);
  }
  if (last.agents_size() > 0) {
    std::printf("\nlast step, per sending agent:\n%s", wb::client::FormatStep(last).c_str());
  }
  if (!trace_file.empty() && !results.empty()) {
    // A trace that cannot be written is said, not a failure of the demo (e.g. a read-only root).
    std::FILE* f = std::fopen(trace_file.c_str(), "w");
    const std::string json = wb::client::StepTraceJson(results);
    if (f != nullptr && std::fwrite(json.data(), 1, json.size(), f) == json.size() &&
        std::fclose(f) == 0) {
      std::printf("\ntimeline of the %zu steps: %s (open in ui.perfetto.dev or chrome://tracing)\n",
                  results.size(), trace_file.c_str());
    } else {
      if (f != nullptr) std::fclose(f);
      std::printf("\n(could not write the trace to %s)\n", trace_file.c_str());
    }
  }
  std::printf("\n");
  if (hold_seconds > 0) {
    // Signals are blocked only now, so the children started above still take SIGTERM.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigprocmask(SIG_BLOCK, &stop, nullptr);
    std::printf("holding every process for %d s (SIGTERM or SIGINT ends it)\n", hold_seconds);
    std::fflush(stdout);
    timespec limit{hold_seconds, 0};
    sigtimedwait(&stop, nullptr, &limit);
  }
  trainers.clear();
  workers.clear();
  if (json_fd >= 0) {
    std::fflush(stdout);
    const std::string line = StepsJson(shape, transport, streams, results, pass);
    if (::write(json_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
      pass = false;
  }
  if (pass) {
    std::printf(
        "PASS: %d steps committed; every inference worker verified its buffers bit for "
        "bit after each commit\n",
        steps);
    return 0;
  }
  std::printf("FAIL: %s\n(logs in %s)\n", failure.c_str(), dir.c_str());
  return 1;
}
