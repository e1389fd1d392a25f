// security_bench: what control-plane security costs. For each mode (plain, token only, mutual
// TLS + token) a real controller and two agents on loopback with one tiny BF16 tensor per side;
// times Plan (which connects and handshakes) and ControllerClient::Step (call -> commit reply)
// over many steps, and prints one JSON line per mode. Run from the repository root:
//   bazel-bin/tests/bench/security_bench --steps=300
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/bench/bench_support.h"
#include "tests/support/cluster.h"
#include "tests/support/process.h"
#include "tests/support/test_pki.h"

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;
using wb::client::ControllerClient;

namespace {

using wb::bench::Die;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void Run(const std::string& mode, const std::string& bin_dir, const std::string& pki, int steps) {
  wb::testing::ClusterOptions options;
  ControllerClient::Security security;
  if (mode == "token") {
    options.extra_controller_yaml = "tls:\n  token_file: " + pki + "/token\n";
    options.extra_agent_yaml = options.extra_controller_yaml;
    security.token_file = pki + "/token";
  } else if (mode == "mtls+token") {
    options.extra_controller_yaml = wb::testing::ControllerTlsYaml(pki);
    for (const auto& a : options.agents) options.agent_yaml[a] = wb::testing::AgentTlsYaml(pki, a);
    security = {pki + "/ca.pem", pki + "/operator.pem", pki + "/operator.key", pki + "/token", ""};
  }
  wb::testing::Cluster cluster(bin_dir, options);
  auto src = wb::client::SharedBuffer::Create(64 * 256 * 2, "src");
  auto dst = wb::client::SharedBuffer::Create(64 * 256 * 2, "dst");
  if (!src.ok() || !dst.ok()) Die("cannot create shared buffers");
  auto trainer =
      wb::client::LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
  auto inference = wb::client::LocalSession::Connect(cluster.socket("inference-node"),
                                                     {v1::ROLE_INFERENCE, 0, 0});
  if (!trainer.ok() || !inference.ok()) Die("cannot open local sessions (see " + cluster.dir());
  wb::client::TensorInfo t{"w", v1::DTYPE_BF16, {64, 256}, {}};
  if (!trainer->Register(t, *src, 0, src->size()).ok() ||
      !inference->Register(t, *dst, 0, dst->size()).ok()) {
    Die("registration failed");
  }
  auto ctl = ControllerClient::Connect(cluster.controller_address(), security);
  if (!ctl.ok()) Die(std::string(ctl.status().message()));
  v1::ExpectedWorld world;
  world.set_trainer_ranks(1);
  world.set_inference_replicas(1);
  world.set_inference_ranks_per_replica(1);
  const auto p0 = Clock::now();
  auto plan = ctl->Plan(world, std::chrono::seconds(20));
  const double plan_ms = Ms(Clock::now() - p0);
  if (!plan.ok()) Die("plan: " + std::string(plan.status().message()));
  std::vector<double> ms;
  for (int v = 1; v <= steps + 5; ++v) {
    std::memset(src->data(), v & 0xff, src->size());
    const auto t0 = Clock::now();
    auto r = ctl->Step(static_cast<uint64_t>(v));
    const double took = Ms(Clock::now() - t0);
    if (!r.ok()) Die("step: " + std::string(r.status().message()));
    if (v > 5) ms.push_back(took);  // the first steps connect and warm up
  }
  if (std::memcmp(src->data(), dst->data(), src->size()) != 0) Die("bytes differ after steps");
  nlohmann::json out = {{"bench", "security"},
                        {"mode", mode},
                        {"steps", steps},
                        {"plan_ms", plan_ms},
                        {"step_p50_ms", Percentile(ms, 0.5)},
                        {"step_p99_ms", Percentile(ms, 0.99)}};
  wb::bench::AddMachineInfo(&out);
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  wb::testing::StopChildrenOnSignals();  // a killed run leaves no daemons behind
  CLI::App app{"security_bench: step round trip without and with TLS / token"};
  int steps = 300;
  std::string bin_dir = "bazel-bin";
  app.add_option("--steps", steps, "timed steps per mode");
  app.add_option("--bin-dir", bin_dir, "where controller/wb-controller and daemon/wb-agent are");
  CLI11_PARSE(app, argc, argv);
  const std::string pki =
      wb::testing::MakeTestPki({"wb-controller", "trainer-node", "inference-node", "operator"});
  if (pki.empty()) Die("openssl failed to make the test PKI");
  for (const char* mode : {"plain", "token", "mtls+token"}) Run(mode, bin_dir, pki, steps);
  return 0;
}
