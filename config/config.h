// Typed configuration of wb-agent and wb-controller, loaded from YAML and validated once.
// Every error names the file, the key path and what was expected; unknown keys are errors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc/tls_config.h"
#include "common/planner/cost_model.h"
#include "common/planner/name_rules.h"
#include "common/planner/relay_options.h"

namespace wb::config {

// The `tls` section lives with the gRPC credentials that read it (common/grpc).
using TlsConfig = ::wb::grpcutil::TlsConfig;

struct TcpTransportConfig {
  bool enabled = true;
  std::string listen = "0.0.0.0:0";  // data-plane listener; port 0 picks a free one
  std::string advertise_host;        // host peers connect to; default: the agent's advertise
  int connections_per_peer = 4;
  uint64_t max_frame_bytes = uint64_t{64} << 20;
  // A connection must present its HELLO within this; unauthenticated ones per source address
  // are capped (the oldest is closed for a new one).
  int handshake_timeout_ms = 5000;
  int max_unauthenticated_per_source = 16;
  // GB/s per direction the tcp rail reports to the planner; 0: the link speed the kernel
  // states for the advertised address's interface, else a nominal 1 GB/s (link_rate.h).
  double gbps = 0;
};

struct RdmaTransportConfig {
  bool enabled = false;
  std::vector<std::string> devices;  // NIC rails, e.g. [mlx5_0, mlx5_1]; empty: all found
  int gid_index = -1;                // -1: pick the RoCE v2 IPv4 GID
  int qps_per_peer = 2;
  int mtu = 1024;  // bytes: 256, 512, 1024, 2048 or 4096
  int send_queue_depth = 256;
  uint64_t chunk_bytes = uint64_t{1} << 20;
};

struct ExecutorConfig {
  uint64_t staging_watermark_bytes = uint64_t{1} << 30;
  uint32_t write_timeout_ms = 30000;
  int prepare_threads = 2;
  // Test hook (tests/security/step_fence_test.cc): the write stage of this version holds each
  // operation for test_hold_ms before posting it (a stage that cannot be interrupted). 0: off.
  uint64_t test_hold_version = 0;
  uint32_t test_hold_ms = 0;
};

// The storage path of delta mode: versions go through a shared directory instead of the
// network (trainer and inference machines that cannot reach each other). Off when dir is empty.
struct StorageConfig {
  std::string dir;
  std::string role;        // "publish" (trainer side) or "subscribe" (inference side)
  int anchor_every = 16;   // publish: a dense anchor at least every N versions
  bool prune = true;       // publish: remove versions older than the previous anchor
  uint32_t poll_ms = 100;  // subscribe: how often the directory is listed
  int writers = 1;         // subscribe: publishing agents that make a version complete
  // The token that keys manifests (HMAC-SHA256); empty: the agent's tls.token_file, and without
  // either, manifests are unsigned. Both sides need the same token.
  std::string token_file;
  // subscribe: how stored (trainer) names map to this agent's destinations; the same keys and
  // defaults as the controller's `renames` and `fusions`.
  std::vector<planner::RenameRule> renames;
  std::vector<planner::FusionRule> fusions = planner::DefaultFusionRules();
};

// Delta mode on a sending agent: where it keeps the shadow of the bytes each destination holds.
// "host": host memory; "none": this agent always sends dense (delta off for it).
struct AgentDeltaConfig {
  std::string shadow = "host";
  // Ops read in place from GPU memory are compared on the GPU; their shadows live in "device"
  // memory (fast, costs GPU memory as large as those ops) or in mapped pinned "host" memory
  // (no GPU memory, every compare reads it across PCIe).
  std::string gpu_shadow = "device";
  // Test hook (receiving side): fail the commit of this version after applying half of its
  // delta slots. 0: off. Set only by tests (tests/integration/delta_test.cc).
  int64_t test_fail_commit_version = 0;
};

// The agent's step-link listener (docs/performance.md, "Step links"), on the host of `listen`.
struct StepLinkConfig {
  bool enabled = true;
  uint32_t port = 0;  // 0: any free port (the controller learns it in OpenStepLink)
};

// Trainer side of "nobody waits" (docs/clients.md, "Steps that do not hold the trainer"): a
// sending agent copies the bytes its ops read into capture memory of its own (device memory for
// CUDA sources) and sends from there, so the trainer may change its weights once every sender
// has captured. Off (0): ops read the live trainer tensors in place, as before.
struct CaptureConfig {
  uint64_t max_bytes = 0;  // capture memory of this agent, all capture buffers together
  // Test hook: every capture waits this long before copying (as one of tens of GB would),
  // stopping early at its deadline or its step's abort. 0: off.
  uint32_t test_delay_ms = 0;
};

// Inference side of "nobody waits": "in_place" (writes land in the live tensors between begin
// and commit) or "staged" (writes land in staging memory of the agent's; the live tensors are
// swapped in one local copy at commit, so an engine pausing on begin pauses for that copy only).
struct ReceiveConfig {
  std::string mode = "in_place";
  uint64_t staging_max_bytes = 0;  // staged: staging memory budget; 0: as much as needed
  uint32_t ack_timeout_ms = 5000;  // how long the swap waits for watchers that acknowledge
  // Test hook, tests only: the staged swap of each version holds this long after its watchers
  // answered, before its copy into the live tensors (an abort then meets a swap in progress).
  uint32_t test_swap_delay_ms = 0;
  uint64_t test_swap_delay_version = 0;  // the version held (0: every version)
  // Staged: how many versions served before are kept for an instant rollback, and the memory
  // they may take (0: as much as needed).
  uint32_t keep_versions = 0;
  uint64_t keep_max_bytes = 0;
};

struct AgentConfig {
  std::string source;  // the file it came from, for messages
  std::string name;    // default: the host name
  std::string log_level = "info";
  std::string local_socket = "/run/weightbeam/agent.sock";
  uint32_t socket_mode = 0660;
  std::string socket_group;             // empty: the agent's own group
  std::string socket_owner;             // user owning the socket; empty: the agent's own user
  std::string listen = "0.0.0.0:7101";  // the Agent gRPC service
  std::string advertise_host;           // how others reach this node; default: listen host
  // host:port of the controller, or a comma-separated list (a leader and its standbys, issue
  // 45): the agent registers and heartbeats with each; only the elected leader drives it.
  std::string controller = "127.0.0.1:7100";
  uint32_t heartbeat_interval_ms = 1000;
  std::string metrics_listen;  // host:port of /metrics; empty: off
  TcpTransportConfig tcp;
  RdmaTransportConfig rdma;
  bool local_enabled = true;
  ExecutorConfig executor;
  TlsConfig tls;
  StorageConfig storage;
  AgentDeltaConfig delta;
  StepLinkConfig step_link;
  CaptureConfig capture;
  ReceiveConfig receive;
};

// Name matching and the cost model belong to the planner (common/planner); the controller's
// configuration holds them under these names.
using RenameRule = ::wb::planner::RenameRule;
using FusionRule = ::wb::planner::FusionRule;
using CostModelConfig = ::wb::planner::CostModel;
using RelayConfig = ::wb::planner::RelayOptions;
using ::wb::planner::DefaultFusionRules;

struct WorldConfig {
  int trainer_ranks = 0;
  int inference_replicas = 0;
  int inference_ranks_per_replica = 0;
};

// Delta mode of the plans this controller makes: ship only the changed elements of each op.
struct DeltaConfig {
  bool enabled = false;
  uint32_t anchor_every = 16;      // a dense anchor step at least every N steps
  double receive_fraction = 0.25;  // receive slot per op, as a fraction of its dense bytes
  bool verify = false;             // receivers check destination hashes at commit
  // The delta step prediction's starting point (controller/delta_prediction.h), until steps
  // of the plan have been measured: elements changed per step, dense bytes each sending agent
  // compares per second (4: one CPU prepare thread; GPU senders ~166, docs/gpu.md), packed
  // bytes each receiving agent applies per second.
  double predict_changed_fraction = 0.01;
  double predict_encode_gbps = 4;
  double predict_apply_gbps = 4;
};

// High availability (docs/reliability.md, issue 45): controllers of one `election` campaign
// through an etcd lease; the leader drives steps, standbys wait warm. Off while `etcd` is empty.
struct HaConfig {
  // Client URLs of the etcd members: "http://host:port", or "https://host:port" with etcd_tls.
  std::vector<std::string> etcd;
  // TLS to etcd (`ha.etcd_tls`): the members' CA, and this controller's certificate and key for
  // members that require client certificates.
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
  std::string election;          // "/weightbeam/election/<election>", "/weightbeam/ledger/..."
  uint32_t lease_ttl_ms = 5000;  // a standby leads within about 2x this after the leader dies
  // host:port clients and agents reach this controller at; empty: `listen` (after --listen),
  // its wildcard host replaced by the host name.
  std::string advertise;
  bool enabled() const { return !etcd.empty(); }
};

struct ControllerConfig {
  std::string source;
  std::string log_level = "info";
  std::string listen = "0.0.0.0:7100";
  uint32_t heartbeat_timeout_ms = 5000;
  uint32_t step_timeout_ms = 60000;
  uint32_t plan_wait_ms = 30000;
  // Elastic fleet (docs/elastic.md): a step fails unless it commits to at least this many
  // inference replicas; the others are skipped and catch up later.
  uint32_t min_replicas = 1;
  std::string metrics_listen;
  WorldConfig world;
  std::vector<RenameRule> renames;
  std::vector<FusionRule> fusions;
  CostModelConfig cost_model;
  TlsConfig tls;
  DeltaConfig delta;
  // Step commands on agents' step links where they offer one (else on gRPC step streams).
  bool step_links = true;
  // Relays (docs/concepts.md "When the planner relays"), off by default; not used in delta
  // mode.
  RelayConfig relays;
  HaConfig ha;
};

// The addresses in an agent's `controller` ("a:7100" or "a:7100,b:7100"), trimmed, empty
// entries dropped.
std::vector<std::string> ControllerAddresses(const std::string& controller);

// Parse from text; `source` names it in errors (a file name, or e.g. "<test>").
absl::StatusOr<AgentConfig> ParseAgentConfig(const std::string& yaml, const std::string& source);
absl::StatusOr<ControllerConfig> ParseControllerConfig(const std::string& yaml,
                                                       const std::string& source);
absl::StatusOr<AgentConfig> LoadAgentConfig(const std::string& path);
absl::StatusOr<ControllerConfig> LoadControllerConfig(const std::string& path);

// The fusion rules a Qwen/Llama-style model needs (qkv_proj, gate_up_proj).

}  // namespace wb::config
