// libFuzzer target for the YAML configuration loader (config/config.h). Every input goes to
// both ParseAgentConfig and ParseControllerConfig; asserts that nothing throws, that an accepted
// configuration lies inside the ranges the loader promises, and that every refusal names the
// source and a key (or says the text is not valid YAML).
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <regex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "config/config.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using wb::config::AgentConfig;
using wb::config::ControllerConfig;
using wb::grpcutil::TlsConfig;

constexpr char kSource[] = "fuzz-input.yaml";
constexpr char kTarget[] = "config_fuzz";

template <typename T>
bool InRange(T value, T lo, T hi) {
  return value >= lo && value <= hi;
}

bool KnownLogLevel(const std::string& level) {
  for (const char* known : {"trace", "debug", "info", "warn", "error", "off"}) {
    if (level == known) return true;
  }
  return false;
}

// Mirrors the loader's host:port rule: a non-empty host, ':' and a decimal port <= 65535.
bool HostPortOk(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  uint64_t port = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    port = port * 10 + static_cast<uint64_t>(s[i] - '0');
    if (port > 65535) return false;
  }
  return true;
}

void CheckTls(const TlsConfig& tls) {
  if (tls.enabled) CHECK_INVARIANT(!tls.cert_file.empty() && !tls.key_file.empty());
  if (tls.require_client_cert) CHECK_INVARIANT(!tls.ca_file.empty());
}

void CheckError(const absl::Status& status) {
  CHECK_INVARIANT(status.code() == absl::StatusCode::kInvalidArgument);
  const absl::string_view message = status.message();
  CHECK_INVARIANT(absl::StrContains(message, kSource));
  CHECK_INVARIANT(absl::StrContains(message, "key '") ||
                  absl::StrContains(message, "not valid YAML"));
}

void CheckAgent(const AgentConfig& c) {
  CHECK_INVARIANT(c.source == kSource);
  CHECK_INVARIANT(KnownLogLevel(c.log_level));
  CHECK_INVARIANT(c.socket_mode <= 07777);
  CHECK_INVARIANT(HostPortOk(c.listen));
  CHECK_INVARIANT(HostPortOk(c.controller));
  CHECK_INVARIANT(c.metrics_listen.empty() || HostPortOk(c.metrics_listen));
  CHECK_INVARIANT(InRange<uint32_t>(c.heartbeat_interval_ms, 10, 600000));
  CHECK_INVARIANT(HostPortOk(c.tcp.listen));
  CHECK_INVARIANT(InRange(c.tcp.connections_per_peer, 1, 64));
  CHECK_INVARIANT(InRange<uint64_t>(c.tcp.max_frame_bytes, 4096, uint64_t{1} << 32));
  CHECK_INVARIANT(InRange(c.rdma.gid_index, -1, 255));
  CHECK_INVARIANT(InRange(c.rdma.qps_per_peer, 1, 64));
  CHECK_INVARIANT(c.rdma.mtu == 256 || c.rdma.mtu == 512 || c.rdma.mtu == 1024 ||
                  c.rdma.mtu == 2048 || c.rdma.mtu == 4096);
  CHECK_INVARIANT(InRange(c.rdma.send_queue_depth, 16, 16384));
  CHECK_INVARIANT(InRange<uint64_t>(c.rdma.chunk_bytes, 4096, uint64_t{1} << 31));
  CHECK_INVARIANT(InRange<uint64_t>(c.executor.staging_watermark_bytes, 4096, uint64_t{1} << 40));
  CHECK_INVARIANT(InRange<uint32_t>(c.executor.write_timeout_ms, 10, 3600000));
  CHECK_INVARIANT(InRange(c.executor.prepare_threads, 1, 64));
  CheckTls(c.tls);
}

void CheckController(const ControllerConfig& c) {
  CHECK_INVARIANT(c.source == kSource);
  CHECK_INVARIANT(KnownLogLevel(c.log_level));
  CHECK_INVARIANT(HostPortOk(c.listen));
  CHECK_INVARIANT(c.metrics_listen.empty() || HostPortOk(c.metrics_listen));
  CHECK_INVARIANT(InRange<uint32_t>(c.heartbeat_timeout_ms, 50, 3600000));
  CHECK_INVARIANT(InRange<uint32_t>(c.step_timeout_ms, 10, 3600000));
  CHECK_INVARIANT(InRange<uint32_t>(c.plan_wait_ms, 0, 3600000));
  CHECK_INVARIANT(InRange(c.world.trainer_ranks, 0, 1 << 20));
  CHECK_INVARIANT(InRange(c.world.inference_replicas, 0, 1 << 20));
  CHECK_INVARIANT(InRange(c.world.inference_ranks_per_replica, 0, 1 << 20));
  for (const auto& rule : c.renames) {
    // The planner compiles these; an accepted pattern must compile.
    try {
      std::regex re(rule.pattern);
    } catch (const std::regex_error&) {
      wb::fuzz::Fail(kTarget, "accepted a rename pattern that is not a regular expression");
    }
  }
  for (const auto& rule : c.fusions) {
    CHECK_INVARIANT(rule.parts.size() >= 2);
    CHECK_INVARIANT(InRange(rule.dim, 0, 7));
  }
  // NaN compares false to everything: check the range positively.
  CHECK_INVARIANT(std::isfinite(c.cost_model.nic_gbps));
  CHECK_INVARIANT(InRange(c.cost_model.nic_gbps, 0.001, 1e6));
  CHECK_INVARIANT(std::isfinite(c.cost_model.op_overhead_us));
  CHECK_INVARIANT(InRange(c.cost_model.op_overhead_us, 0.0, 1e6));
  CheckTls(c.tls);
}

// Focused mode: an input starting with kFocusedMarker is [marker, template index, value...]
// and becomes one template below with '@' replaced by the value (one line). This puts fuzzed
// values straight into each key, so range checks get probed without first finding the nesting.
constexpr uint8_t kFocusedMarker = 0xFF;
constexpr const char* kTemplates[] = {
    // agent
    "name: @\n",
    "log_level: @\n",
    "socket_mode: @\n",
    "listen: @\n",
    "controller: @\n",
    "heartbeat_interval_ms: @\n",
    "metrics_listen: @\n",
    "transports:\n  tcp:\n    listen: @\n",
    "transports:\n  tcp:\n    connections_per_peer: @\n",
    "transports:\n  tcp:\n    max_frame_bytes: @\n",
    "transports:\n  tcp:\n    enabled: @\n",
    "transports:\n  rdma:\n    devices: @\n",
    "transports:\n  rdma:\n    gid_index: @\n",
    "transports:\n  rdma:\n    qps_per_peer: @\n",
    "transports:\n  rdma:\n    mtu: @\n",
    "transports:\n  rdma:\n    send_queue_depth: @\n",
    "transports:\n  rdma:\n    chunk_bytes: @\n",
    "executor:\n  staging_watermark_bytes: @\n",
    "executor:\n  write_timeout_ms: @\n",
    "executor:\n  prepare_threads: @\n",
    "tls:\n  enabled: true\n  cert_file: c\n  key_file: @\n",
    "tls:\n  require_client_cert: true\n  ca_file: @\n",
    // controller
    "heartbeat_timeout_ms: @\n",
    "step_timeout_ms: @\n",
    "plan_wait_ms: @\n",
    "world:\n  trainer_ranks: @\n",
    "world:\n  inference_replicas: @\n",
    "world:\n  inference_ranks_per_replica: @\n",
    "renames:\n  - pattern: @\n    replacement: x\n",
    "fusions:\n  - fused: f\n    parts: @\n",
    "fusions:\n  - fused: f\n    parts: [a, b]\n    dim: @\n",
    "cost_model:\n  nic_gbps: @\n",
    "cost_model:\n  op_overhead_us: @\n",
};
constexpr size_t kTemplateCount = sizeof(kTemplates) / sizeof(kTemplates[0]);

// One instrumented function per template: coverage alone cannot tell which key a value went
// to (every integer key runs the same ReadInt), so without this libFuzzer keeps one focused
// input for all integer keys together and rarely probes the edges of each key's range.
template <size_t N>
__attribute__((noinline)) void MarkTemplate() {
  asm volatile("" ::: "memory");
}
template <size_t... N>
constexpr std::array<void (*)(), sizeof...(N)> MakeMarks(std::index_sequence<N...>) {
  return {&MarkTemplate<N>...};
}
constexpr auto kMarks = MakeMarks(std::make_index_sequence<kTemplateCount>());

std::string InputToYaml(const uint8_t* data, size_t size) {
  if (size < 2 || data[0] != kFocusedMarker) {
    return std::string(reinterpret_cast<const char*>(data), size);
  }
  std::string value;
  for (size_t i = 2; i < size && data[i] != '\n' && data[i] != '\r'; ++i) {
    value.push_back(static_cast<char>(data[i]));
  }
  kMarks[data[1] % kTemplateCount]();
  std::string yaml = kTemplates[data[1] % kTemplateCount];
  yaml.replace(yaml.find('@'), 1, value);
  return yaml;
}

// Runs `parse` (named `name`) on `yaml`: an accepted configuration goes to `check`, a refusal
// to CheckError; any exception is a failure.
template <typename Parse, typename Check>
void ParseAndCheck(const char* name, Parse parse, Check check, const std::string& yaml) {
  try {
    auto config = parse(yaml, kSource);
    if (config.ok()) {
      check(*config);
    } else {
      CheckError(config.status());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s threw %s\n", name, e.what());
    wb::fuzz::Fail(kTarget, (std::string(name) + " threw").c_str());
  } catch (...) {
    wb::fuzz::Fail(kTarget, (std::string(name) + " threw a non-std exception").c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml = InputToYaml(data, size);
  ParseAndCheck("ParseAgentConfig", wb::config::ParseAgentConfig, CheckAgent, yaml);
  ParseAndCheck("ParseControllerConfig", wb::config::ParseControllerConfig, CheckController, yaml);
  return 0;
}
