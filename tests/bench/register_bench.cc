// register_bench: registration at scale. A real wb-controller and two wb-agent processes; a
// trainer session registers N tiny BF16 tensors (one shared-memory buffer, offsets) in batches
// of B through LocalSession::RegisterBatches (pipelined; --in-flight=1: RegisterBatch), an
// inference session registers the N matching destinations; then the controller's view catches up,
// Plan runs and one step commits. Prints one JSON line: tensors/s per side, seconds until the
// controller lists every tensor, plan seconds, step seconds, ListTensors seconds, the agents' peak
// RSS, and per agent and transport the memory registrations it holds and the seconds it spent
// registering (Health). Run from the repository root: bazel-bin/tests/bench/register_bench
// --tensors=1000000
// With --rdma-device=rxe0 (inside tests/rxe/vm.sh) the agents also run the rdma transport;
// --no-plan stops after the registrations (and the counts the agents report).
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/bench/bench_support.h"
#include "tests/support/cluster.h"
#include "tests/support/process.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;
using namespace wb::client;

namespace {

using wb::bench::Die;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// VmHWM of `pid` in MiB (0 when unreadable).
// A field of /proc/PID/status in MiB: VmHWM (peak) or VmRSS (now).
double StatusMiB(pid_t pid, const std::string& field) {
  std::istringstream in(wb::testing::ReadFile("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return 0;
}
double PeakRssMiB(pid_t pid) { return StatusMiB(pid, "VmHWM"); }

// Registers `n` tensors "layer.<i>.w" of 2 elements each (4 bytes at offset 4 i) in batches of
// `batch`, `in_flight` requests on their way at once (1: each batch waits for its answer).
double RegisterAll(LocalSession& s, const SharedBuffer& buf, int n, int batch, int in_flight) {
  const auto t0 = Clock::now();
  std::vector<std::vector<BufferSlice>> batches;
  batches.reserve((n + batch - 1) / batch);
  for (int i = 0; i < n; i += batch) {
    auto& slices = batches.emplace_back();
    slices.reserve(std::min(n, i + batch) - i);
    for (int k = i; k < std::min(n, i + batch); ++k) {
      slices.push_back(
          {TensorInfo{"layer." + std::to_string(k) + ".w", v1::DTYPE_BF16, {2}, {}}, 4ull * k, 4});
    }
  }
  if (in_flight <= 1) {
    for (size_t b = 0; b < batches.size(); ++b) {
      if (auto st = s.RegisterBatch(batches[b], buf); !st.ok()) {
        Die("registering batch " + std::to_string(b) + ": " + std::string(st.message()));
      }
    }
  } else if (auto st = s.RegisterBatches(batches, buf, in_flight); !st.ok()) {
    Die("registering: " + std::string(st.message()));
  }
  return Since(t0);
}

int64_t TensorCount(ControllerClient& ctl) {
  auto st = ctl.Status();
  if (!st.ok()) return -1;
  int64_t n = 0;
  for (const auto& a : st->agents()) n += a.tensors();
  return n;
}

// Per transport: {"regions": registrations held, "registered": registrations made since start
// (re-registrations included), "seconds": time spent registering}, from the agent's Health.
nlohmann::json Registrations(const std::string& address) {
  auto stub = v1::Agent::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::HealthResponse health;
  grpc::Status s = stub->Health(&ctx, v1::HealthRequest(), &health);
  if (!s.ok()) Die("Agent.Health at " + address + ": " + s.error_message());
  nlohmann::json out = nlohmann::json::object();
  for (const auto& r : health.registrations()) {
    out[r.transport()] = {
        {"regions", r.regions()}, {"registered", r.registered()}, {"seconds", r.seconds()}};
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  wb::testing::StopChildrenOnSignals();  // a killed run leaves no daemons behind
  CLI::App app{"register_bench: registering, listing and planning N tiny tensors"};
  int tensors = 1000000, batch = 1000, inference_tensors = -1, in_flight = 4;
  std::string bin_dir = "bazel-bin", rdma_device;
  bool step = true, hugetlb = true, plan_too = true;
  app.add_option("--tensors", tensors, "tensors per side (trainer and inference)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--inference-tensors", inference_tensors,
                 "destination tensors (default: --tensors); the first ones of the trainer's");
  app.add_option("--batch", batch, "tensors per RegisterBatch request")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--in-flight", in_flight,
                 "RegisterBatch requests on their way at once (1: one at a time, as before)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--bin-dir", bin_dir, "where controller/wb-controller and daemon/wb-agent are");
  app.add_flag("!--no-step", step, "skip the step after planning");
  app.add_flag("!--no-plan", plan_too, "stop after registering (no Plan, no step)");
  app.add_option("--rdma-device", rdma_device,
                 "also run the rdma transport on this device (e.g. rxe0 in tests/rxe/vm.sh)");
  app.add_flag("--malloc-hugetlb,!--no-malloc-hugetlb", hugetlb,
               "start the daemons with glibc malloc on transparent huge pages, as the deploy/ "
               "units do (default on)");
  CLI11_PARSE(app, argc, argv);
  // The daemons inherit this process's environment. A tunables string given by the caller wins.
  if (hugetlb) setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1", /*overwrite=*/0);
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (inference_tensors < 0 || inference_tensors > tensors) inference_tensors = tensors;

  wb::testing::ClusterOptions options;
  options.heartbeat_timeout_ms = 30000;
  options.extra_agent_yaml = "log_level: warn\n";
  if (!rdma_device.empty()) {
    options.transports_yaml = "  rdma:\n    enabled: true\n    devices: [" + rdma_device + "]\n";
  }
  wb::testing::Cluster cluster(bin_dir, options);
  auto ctl = ControllerClient::Connect(cluster.controller_address());
  if (!ctl.ok()) Die(std::string(ctl.status().message()));

  auto src = SharedBuffer::Create(4ull * tensors);
  auto dst = SharedBuffer::Create(4ull * tensors);
  if (!src.ok() || !dst.ok()) Die("cannot create shared memory");
  auto* p = static_cast<uint16_t*>(src->data());
  for (int64_t i = 0; i < 2ll * tensors; ++i) p[i] = static_cast<uint16_t>(0x3c00 + (i & 0x3ff));

  auto trainer =
      LocalSession::Connect(cluster.socket("trainer-node"), Identity{v1::ROLE_TRAINER, 0, 0});
  auto inference =
      LocalSession::Connect(cluster.socket("inference-node"), Identity{v1::ROLE_INFERENCE, 0, 0});
  if (!trainer.ok() || !inference.ok()) Die("cannot open sessions");

  const auto t_all = Clock::now();
  const double src_s = RegisterAll(*trainer, *src, tensors, batch, in_flight);
  const double dst_s = RegisterAll(*inference, *dst, inference_tensors, batch, in_flight);
  const double registered_s = Since(t_all);
  // The controller's view: layout reports are coalesced, so it trails the last batch a little.
  const int64_t total = int64_t{tensors} + inference_tensors;
  if (!wb::testing::WaitUntil([&] { return TensorCount(*ctl) == total; },
                              std::chrono::seconds(300))) {
    Die("the controller never listed " + std::to_string(total) + " tensors (has " +
        std::to_string(TensorCount(*ctl)) + ")");
  }
  const double visible_s = Since(t_all);
  const nlohmann::json trainer_regs = Registrations(cluster.agent_address("trainer-node"));
  const nlohmann::json inference_regs = Registrations(cluster.agent_address("inference-node"));

  if (!plan_too) {
    nlohmann::json j;
    j["bench"] = "register";
    j["trainer_tensors"] = tensors;
    j["inference_tensors"] = inference_tensors;
    j["batch"] = batch;
    j["register_trainer_tensors_per_s"] = tensors / src_s;
    j["register_inference_tensors_per_s"] = inference_tensors / dst_s;
    j["register_seconds_both_sides"] = registered_s;
    j["trainer_agent_registrations"] = trainer_regs;
    j["inference_agent_registrations"] = inference_regs;
    j["controller_lists_all_after_s"] = visible_s;
    wb::bench::AddMachineInfo(&j);
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }

  auto t0 = Clock::now();
  auto listed = ctl->ListTensors("");
  const double list_s = Since(t0);
  if (!listed.ok()) Die("ListTensors: " + std::string(listed.status().message()));
  int64_t listed_n = 0;
  for (const auto& l : listed->layouts()) listed_n += l.tensors_size();

  v1::ExpectedWorld world;
  world.set_trainer_ranks(1);
  world.set_inference_replicas(1);
  world.set_inference_ranks_per_replica(1);
  t0 = Clock::now();
  auto plan = ctl->Plan(world, std::chrono::seconds(60));
  const double plan_s = Since(t0);
  if (!plan.ok()) Die("plan: " + std::string(plan.status().message()));
  // What the sender keeps once its plan is loaded (the peak comes while parsing it).
  const double trainer_after_plan_mib = StatusMiB(cluster.agent("trainer-node")->pid(), "VmRSS");

  double step_s = 0;
  if (step) {
    t0 = Clock::now();
    auto r = ctl->Step(1, std::chrono::seconds(600));
    step_s = Since(t0);
    if (!r.ok()) Die("step: " + std::string(r.status().message()));
    if (std::memcmp(src->data(), dst->data(), 4ull * inference_tensors) != 0) Die("bytes differ");
  }

  nlohmann::json j;
  j["bench"] = "register";
  j["trainer_tensors"] = tensors;
  j["batch"] = batch;
  j["in_flight"] = in_flight;
  j["register_trainer_tensors_per_s"] = tensors / src_s;
  j["inference_tensors"] = inference_tensors;
  j["register_inference_tensors_per_s"] = inference_tensors / dst_s;
  j["register_seconds_both_sides"] = registered_s;
  j["trainer_agent_registrations"] = trainer_regs;
  j["inference_agent_registrations"] = inference_regs;
  j["controller_lists_all_after_s"] = visible_s;
  j["controller_peak_rss_mib"] = PeakRssMiB(cluster.controller()->pid());
  j["list_tensors_seconds"] = list_s;
  j["list_tensors_count"] = listed_n;
  j["plan_seconds"] = plan_s;
  j["plan_ops"] = plan->total_ops();
  j["step_seconds"] = step_s;
  j["trainer_agent_rss_after_plan_mib"] = trainer_after_plan_mib;
  j["trainer_agent_peak_rss_mib"] = PeakRssMiB(cluster.agent("trainer-node")->pid());
  j["inference_agent_peak_rss_mib"] = PeakRssMiB(cluster.agent("inference-node")->pid());
  wb::bench::AddMachineInfo(&j);
  j["daemon_glibc_tunables"] = tunables ? tunables : "";
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
