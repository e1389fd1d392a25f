// Config loading: good files give the expected values; each kind of bad file fails with a
// message that names the file and the key.
#include "config/config.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

using wb::config::ParseAgentConfig;
using wb::config::ParseControllerConfig;

namespace {

std::string ErrorOf(const std::string& yaml) {
  auto c = ParseAgentConfig(yaml, "agent.yaml");
  REQUIRE_FALSE(c.ok());
  return std::string(c.status().message());
}

std::string ControllerErrorOf(const std::string& yaml) {
  auto c = ParseControllerConfig(yaml, "controller.yaml");
  REQUIRE_FALSE(c.ok());
  return std::string(c.status().message());
}

}  // namespace

TEST_CASE("an empty agent file gives the documented defaults") {
  auto c = ParseAgentConfig("", "agent.yaml");
  REQUIRE(c.ok());
  CHECK(c->local_socket == "/run/weightbeam/agent.sock");
  CHECK(c->socket_mode == 0660);
  CHECK(c->controller == "127.0.0.1:7100");
  CHECK(c->tcp.enabled);
  CHECK_FALSE(c->rdma.enabled);
  CHECK(c->executor.staging_watermark_bytes == (uint64_t{1} << 30));
}

TEST_CASE("a full agent file loads into the expected values") {
  auto c = ParseAgentConfig(R"(
name: inference-0
log_level: debug
local_socket: /tmp/wb.sock
socket_mode: 0640
listen: 10.0.0.2:7101
controller: 10.0.0.1:7100
heartbeat_interval_ms: 250
transports:
  tcp:
    listen: 0.0.0.0:7201
    connections_per_peer: 8
    gbps: 3.125
  rdma:
    enabled: true
    devices: [mlx5_0, mlx5_1]
    gid_index: 3
    mtu: 4096
    chunk_bytes: 4MiB
executor:
  staging_watermark_bytes: 512MiB
  write_timeout_ms: 5000
)",
                            "agent.yaml");
  REQUIRE(c.ok());
  CHECK(c->name == "inference-0");
  CHECK(c->log_level == "debug");
  CHECK(c->socket_mode == 0640);
  CHECK(c->heartbeat_interval_ms == 250);
  CHECK(c->tcp.connections_per_peer == 8);
  CHECK(c->tcp.gbps == 3.125);
  CHECK(c->rdma.enabled);
  CHECK(c->rdma.devices == std::vector<std::string>{"mlx5_0", "mlx5_1"});
  CHECK(c->rdma.gid_index == 3);
  CHECK(c->rdma.mtu == 4096);
  CHECK(c->rdma.chunk_bytes == 4u << 20);
  CHECK(c->executor.staging_watermark_bytes == 512u << 20);
  CHECK(c->executor.write_timeout_ms == 5000);
}

TEST_CASE("an unknown key is an error naming the file and the key path") {
  std::string e = ErrorOf("transports:\n  tcp:\n    conections_per_peer: 4\n");
  CHECK_THAT(e, Catch::Contains("agent.yaml"));
  CHECK_THAT(e, Catch::Contains("unknown key 'transports.tcp.conections_per_peer'"));
}

TEST_CASE("a value of the wrong type names the key and what was expected") {
  std::string e = ErrorOf("heartbeat_interval_ms: often\n");
  CHECK_THAT(e, Catch::Contains("agent.yaml: key 'heartbeat_interval_ms'"));
  CHECK_THAT(e, Catch::Contains("expected an integer from 10 to 600000, got 'often'"));
  e = ErrorOf("transports:\n  rdma:\n    devices: mlx5_0\n");
  CHECK_THAT(e, Catch::Contains("'transports.rdma.devices': expected a list of strings"));
  e = ErrorOf("transports: 3\n");
  CHECK_THAT(e, Catch::Contains("'transports': expected a mapping, got '3'"));
}

TEST_CASE("out-of-range values are rejected with the allowed range") {
  CHECK_THAT(ErrorOf("transports:\n  tcp:\n    connections_per_peer: 0\n"),
             Catch::Contains("expected an integer from 1 to 64, got '0'"));
  CHECK_THAT(ErrorOf("transports:\n  tcp:\n    gbps: -1\n"),
             Catch::Contains("'transports.tcp.gbps': expected a number from 0 to 10000"));
  CHECK_THAT(ErrorOf("transports:\n  tcp:\n    gbps: fast\n"),
             Catch::Contains("'transports.tcp.gbps'"));
  CHECK_THAT(ErrorOf("transports:\n  rdma:\n    mtu: 1500\n"),
             Catch::Contains("one of 256, 512, 1024, 2048, 4096"));
  CHECK_THAT(ErrorOf("executor:\n  staging_watermark_bytes: 12 parsecs\n"),
             Catch::Contains("'executor.staging_watermark_bytes': expected a byte count"));
  CHECK_THAT(ErrorOf("log_level: loud\n"),
             Catch::Contains("expected one of trace, debug, info, warn, error, off, got 'loud'"));
  CHECK_THAT(ErrorOf("controller: nohost\n"), Catch::Contains("expected host:port"));
}

TEST_CASE("inputs found by fuzzing are refused with a message, not a crash") {
  // std::stoul used to throw out_of_range on a 20+ digit port.
  CHECK_THAT(ErrorOf("listen: a:99999999999999999999999\n"),
             Catch::Contains("'listen': expected host:port, got 'a:99999999999999999999999'"));
  // strtod accepts "nan", which compares false to both ends of the range.
  CHECK_THAT(ControllerErrorOf("cost_model: {nic_gbps: nan}\n"),
             Catch::Contains("'cost_model.nic_gbps': expected a number from"));
}

TEST_CASE("every error in a file is reported at once") {
  std::string e = ErrorOf("bogus: 1\nheartbeat_interval_ms: -5\nlog_level: loud\n");
  CHECK_THAT(e, Catch::Contains("unknown key 'bogus'"));
  CHECK_THAT(e, Catch::Contains("'heartbeat_interval_ms'"));
  CHECK_THAT(e, Catch::Contains("'log_level'"));
}

TEST_CASE("broken YAML reports the line") {
  std::string e = ErrorOf("name: [unclosed\n");
  CHECK_THAT(e, Catch::Contains("agent.yaml:"));
  CHECK_THAT(e, Catch::Contains("not valid YAML"));
}

TEST_CASE("a missing file is a clear error") {
  auto c = wb::config::LoadAgentConfig("/nonexistent/agent.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(std::string(c.status().message()),
             Catch::Contains("/nonexistent/agent.yaml: cannot open"));
}

TEST_CASE("controller config: defaults, world, rules and cost model") {
  auto d = ParseControllerConfig("", "controller.yaml");
  REQUIRE(d.ok());
  CHECK(d->listen == "0.0.0.0:7100");
  REQUIRE(d->fusions.size() == 2);
  CHECK(d->fusions[0].fused == "qkv_proj.weight");

  auto c = ParseControllerConfig(R"(
listen: 127.0.0.1:9000
step_timeout_ms: 2000
world: {trainer_ranks: 4, inference_replicas: 2, inference_ranks_per_replica: 2}
renames:
  - {pattern: '^module\.(.*)$', replacement: '\1'}
fusions:
  - {fused: qkv.weight, parts: [q.weight, k.weight, v.weight]}
cost_model: {nic_gbps: 25, op_overhead_us: 5}
)",
                                 "controller.yaml");
  REQUIRE(c.ok());
  CHECK(c->step_timeout_ms == 2000);
  CHECK(c->world.trainer_ranks == 4);
  CHECK(c->world.inference_ranks_per_replica == 2);
  REQUIRE(c->renames.size() == 1);
  CHECK(c->renames[0].replacement == "\\1");
  REQUIRE(c->fusions.size() == 1);
  CHECK(c->fusions[0].parts.size() == 3);
  CHECK(c->cost_model.nic_gbps == 25);
}

TEST_CASE("step links: on by default, can be turned off on either side, ports checked") {
  auto a = wb::config::ParseAgentConfig("", "agent.yaml");
  REQUIRE(a.ok());
  CHECK(a->step_link.enabled);
  CHECK(a->step_link.port == 0);
  auto off =
      wb::config::ParseAgentConfig("step_link: {enabled: false, port: 7102}\n", "agent.yaml");
  REQUIRE(off.ok());
  CHECK_FALSE(off->step_link.enabled);
  CHECK(off->step_link.port == 7102);
  CHECK_THAT(ErrorOf("step_link: {port: 70000}\n"),
             Catch::Contains("'step_link.port': expected an integer from 0 to 65535"));
  CHECK_THAT(ErrorOf("step_link: {enable: false}\n"),
             Catch::Contains("unknown key 'step_link.enable'"));
  auto c = ParseControllerConfig("", "controller.yaml");
  REQUIRE(c.ok());
  CHECK(c->step_links);
  auto c_off = ParseControllerConfig("step_links: false\n", "controller.yaml");
  REQUIRE(c_off.ok());
  CHECK_FALSE(c_off->step_links);
  CHECK_THAT(ControllerErrorOf("step_links: sometimes\n"), Catch::Contains("'step_links'"));
}

TEST_CASE("controller config: missing required keys and bad rules are named") {
  std::string e = ControllerErrorOf("fusions:\n  - {fused: qkv.weight}\n");
  CHECK_THAT(e, Catch::Contains("controller.yaml: key 'fusions[0].parts' is required"));
  e = ControllerErrorOf("renames:\n  - {pattern: '([', replacement: x}\n");
  CHECK_THAT(e, Catch::Contains("'renames[0].pattern': expected a regular expression"));
  e = ControllerErrorOf("tls: {enabled: true}\n");
  CHECK_THAT(e, Catch::Contains("'tls.cert_file'"));
  e = ControllerErrorOf("world: {trainer_ranks: many}\n");
  CHECK_THAT(e, Catch::Contains("'world.trainer_ranks'"));
}

TEST_CASE("agent tls: mutual TLS needs the controller's identity, and that needs a CA") {
  std::string e = ErrorOf(
      "tls: {enabled: true, cert_file: a.pem, key_file: a.key, ca_file: ca.pem, "
      "require_client_cert: true}\n");
  CHECK_THAT(e, Catch::Contains("'tls.controller_identity': expected the controller "
                                "certificate's CN or SAN when require_client_cert is true"));
  e = ErrorOf(
      "tls: {enabled: true, cert_file: a.pem, key_file: a.key, controller_identity: ctl}\n");
  CHECK_THAT(e, Catch::Contains("'tls.ca_file'"));
  auto c = ParseAgentConfig(
      "tls: {enabled: true, cert_file: a.pem, key_file: a.key, ca_file: ca.pem, "
      "require_client_cert: true, controller_identity: wb-controller, server_name: ctl.local, "
      "token_file: /etc/weightbeam/token}\n",
      "agent.yaml");
  REQUIRE(c.ok());
  CHECK(c->tls.controller_identity == "wb-controller");
  CHECK(c->tls.server_name == "ctl.local");
}

TEST_CASE("the example files in config/examples load") {
  for (const char* name : {"config/examples/agent.yaml", "config/examples/agent-inference.yaml",
                           "config/examples/agent-storage-publish.yaml",
                           "config/examples/agent-storage-subscribe.yaml"}) {
    auto c = wb::config::LoadAgentConfig(name);
    INFO(name);
    REQUIRE(c.ok());
  }
  for (const char* name :
       {"config/examples/controller.yaml", "config/examples/controller-ha.yaml"}) {
    auto c = wb::config::LoadControllerConfig(name);
    INFO(name << ": " << c.status().message());
    REQUIRE(c.ok());
  }
}

TEST_CASE("the deployment configs in deploy/etc load") {
  for (const char* name : {"deploy/etc/agent-train-0.yaml", "deploy/etc/agent-infer-0.yaml"}) {
    auto c = wb::config::LoadAgentConfig(name);
    INFO(name << ": " << c.status().message());
    REQUIRE(c.ok());
    CHECK(c->rdma.enabled);
    CHECK(c->tls.require_client_cert);
  }
  auto c = wb::config::LoadControllerConfig("deploy/etc/controller.yaml");
  INFO(c.status().message());
  REQUIRE(c.ok());
  CHECK(c->world.inference_ranks_per_replica == 8);
  CHECK(c->tls.require_client_cert);
}

TEST_CASE("integers are decimal even with a leading zero") {
  auto c = ParseAgentConfig("executor:\n  write_timeout_ms: 0100\n", "agent.yaml");
  REQUIRE(c.ok());
  CHECK(c->executor.write_timeout_ms == 100);
}

TEST_CASE("the storage section: off by default, read when set, role required with a dir") {
  auto off = ParseAgentConfig("", "agent.yaml");
  REQUIRE(off.ok());
  CHECK(off->storage.dir.empty());
  CHECK(off->storage.anchor_every == 16);
  auto c = ParseAgentConfig(
      "storage:\n  dir: /mnt/bucket\n  role: subscribe\n  poll_ms: 50\n  writers: 2\n"
      "  anchor_every: 8\n  prune: false\n",
      "agent.yaml");
  REQUIRE(c.ok());
  CHECK(c->storage.dir == "/mnt/bucket");
  CHECK(c->storage.role == "subscribe");
  CHECK(c->storage.poll_ms == 50);
  CHECK(c->storage.writers == 2);
  CHECK(c->storage.anchor_every == 8);
  CHECK_FALSE(c->storage.prune);
  CHECK(c->storage.renames.empty());
  CHECK(c->storage.fusions.size() == 2);  // the defaults, as for the controller
  auto rules = ParseAgentConfig(
      "storage:\n  dir: /x\n  role: subscribe\n  renames:\n    - pattern: 'trainer\\.(.*)'\n"
      "      replacement: '\\1'\n  fusions:\n    - fused: ab\n      parts: [a, b]\n",
      "agent.yaml");
  INFO((rules.ok() ? "" : std::string(rules.status().message())));
  REQUIRE(rules.ok());
  REQUIRE(rules->storage.renames.size() == 1);
  CHECK(rules->storage.renames[0].pattern == "trainer\\.(.*)");
  REQUIRE(rules->storage.fusions.size() == 1);
  CHECK(rules->storage.fusions[0].parts == std::vector<std::string>{"a", "b"});
  CHECK_THAT(ErrorOf("storage:\n  dir: /x\n  role: subscribe\n  fusions:\n    - fused: ab\n"
                     "      parts: [a]\n"),
             Catch::Contains("key 'storage.fusions[0].parts'"));
  CHECK_THAT(ErrorOf("storage:\n  dir: /mnt/bucket\n"),
             Catch::Contains("agent.yaml: key 'storage.role': expected publish or subscribe when "
                             "storage.dir is set, got none"));
  CHECK_THAT(ErrorOf("storage:\n  dir: /x\n  role: both\n"),
             Catch::Contains("key 'storage.role': expected one of publish, subscribe"));
  CHECK_THAT(ErrorOf("storage:\n  dir: /x\n  role: publish\n  anchor_evry: 3\n"),
             Catch::Contains("unknown key 'storage.anchor_evry'"));
}

TEST_CASE("delta mode keys: controller plan settings and the agent's shadow placement") {
  auto c = ParseControllerConfig(
      "delta:\n  enabled: true\n  anchor_every: 8\n  receive_fraction: 0.1\n  verify: true\n",
      "controller.yaml");
  REQUIRE(c.ok());
  CHECK(c->delta.enabled);
  CHECK(c->delta.anchor_every == 8);
  CHECK(c->delta.receive_fraction == Approx(0.1));
  CHECK(c->delta.verify);
  auto d = ParseControllerConfig("", "controller.yaml");
  REQUIRE(d.ok());
  CHECK_FALSE(d->delta.enabled);
  CHECK(d->delta.anchor_every == 16);
  CHECK_THAT(ControllerErrorOf("delta:\n  anchor_every: 0\n"),
             Catch::Contains("key 'delta.anchor_every'"));
  CHECK_THAT(ControllerErrorOf("delta:\n  receive_fraction: 2\n"),
             Catch::Contains("key 'delta.receive_fraction'"));
  auto a = ParseAgentConfig("delta:\n  shadow: none\n", "agent.yaml");
  REQUIRE(a.ok());
  CHECK(a->delta.shadow == "none");
  CHECK(a->delta.test_fail_commit_version == 0);
  CHECK(a->delta.gpu_shadow == "device");  // the default
  auto g = ParseAgentConfig("delta:\n  gpu_shadow: host\n", "agent.yaml");
  REQUIRE(g.ok());
  CHECK(g->delta.gpu_shadow == "host");
  CHECK_THAT(ErrorOf("delta:\n  gpu_shadow: pcie\n"),
             Catch::Contains("key 'delta.gpu_shadow'") && Catch::Contains("device"));
  CHECK_THAT(ErrorOf("delta:\n  shadow: cuda\n"),
             Catch::Contains("key 'delta.shadow'") && Catch::Contains("host"));
  auto hook = ParseAgentConfig("delta:\n  test_fail_commit_version: 6\n", "agent.yaml");
  REQUIRE(hook.ok());
  CHECK(hook->delta.test_fail_commit_version == 6);
}

TEST_CASE(
    "capture and staged receive: off and in place by default, read when set, bad values named") {
  auto d = ParseAgentConfig("", "agent.yaml");
  REQUIRE(d.ok());
  CHECK(d->capture.max_bytes == 0);
  CHECK(d->receive.mode == "in_place");
  CHECK(d->receive.staging_max_bytes == 0);
  CHECK(d->receive.ack_timeout_ms == 5000);

  auto c = ParseAgentConfig(R"(
capture:
  max_bytes: 2GiB
receive:
  mode: staged
  staging_max_bytes: 512MiB
  ack_timeout_ms: 750
)",
                            "agent.yaml");
  REQUIRE(c.ok());
  CHECK(c->capture.max_bytes == (uint64_t{2} << 30));
  CHECK(c->receive.mode == "staged");
  CHECK(c->receive.staging_max_bytes == (uint64_t{512} << 20));
  CHECK(c->receive.ack_timeout_ms == 750);

  CHECK_THAT(ErrorOf("receive:\n  mode: swapped\n"),
             Catch::Contains("receive.mode") && Catch::Contains("staged"));
  CHECK_THAT(ErrorOf("receive:\n  ack_timeout_ms: 0\n"), Catch::Contains("receive.ack_timeout_ms"));
  CHECK_THAT(ErrorOf("capture:\n  slots: 2\n"), Catch::Contains("capture.slots"));
}

TEST_CASE("high availability: ha keys on the controller, several controllers on the agent") {
  auto off = ParseControllerConfig("", "controller.yaml");
  REQUIRE(off.ok());
  CHECK_FALSE(off->ha.enabled());
  CHECK(off->ha.lease_ttl_ms == 5000);

  auto on = ParseControllerConfig(
      "ha:\n  etcd: [http://10.0.0.5:2379, http://10.0.0.6:2379]\n  election: rl-run.7\n"
      "  lease_ttl_ms: 3000\n  advertise: 10.0.0.7:7100\n",
      "controller.yaml");
  REQUIRE(on.ok());
  CHECK(on->ha.enabled());
  CHECK(on->ha.etcd == std::vector<std::string>{"http://10.0.0.5:2379", "http://10.0.0.6:2379"});
  CHECK(on->ha.election == "rl-run.7");
  CHECK(on->ha.lease_ttl_ms == 3000);
  CHECK(on->ha.advertise == "10.0.0.7:7100");

  CHECK_THAT(ControllerErrorOf("ha:\n  etcd: [http://e:2379]\n"),
             Catch::Contains("ha.election") && Catch::Contains("an election name"));
  CHECK_THAT(ControllerErrorOf("ha:\n  etcd: [https://e:2379]\n  election: x\n"),
             Catch::Contains("ha.etcd") && Catch::Contains("with etcd_tls.ca_file"));
  auto tls = ParseControllerConfig(
      "ha:\n  etcd: [https://e:2379]\n  election: x\n  etcd_tls:\n    ca_file: /ca.pem\n"
      "    cert_file: /c.pem\n    key_file: /c.key\n",
      "controller.yaml");
  REQUIRE(tls.ok());
  CHECK(tls->ha.etcd_ca_file == "/ca.pem");
  CHECK(tls->ha.etcd_key_file == "/c.key");
  CHECK_THAT(ControllerErrorOf("ha:\n  etcd: [http://e:2379]\n  election: x\n  etcd_tls:\n"
                               "    ca_file: /ca.pem\n"),
             Catch::Contains("(etcd_tls is set)"));
  CHECK_THAT(ControllerErrorOf("ha:\n  etcd: [https://e:2379]\n  election: x\n  etcd_tls:\n"
                               "    ca_file: /ca.pem\n    cert_file: /c.pem\n"),
             Catch::Contains("ha.etcd_tls.key_file"));
  CHECK_THAT(ControllerErrorOf("ha:\n  etcd: [http://e:2379]\n  election: a/b\n"),
             Catch::Contains("ha.election") && Catch::Contains("'a/b'"));
  CHECK_THAT(ControllerErrorOf("ha:\n  etcd: [http://e:2379]\n  election: x\n  lease_ttl_ms: 10\n"),
             Catch::Contains("ha.lease_ttl_ms"));
  CHECK_THAT(ControllerErrorOf("ha:\n  etcd: [http://e:2379]\n  election: x\n  leader: y\n"),
             Catch::Contains("ha.leader"));

  auto agent = ParseAgentConfig("controller: 10.0.0.7:7100, 10.0.0.8:7100\n", "agent.yaml");
  REQUIRE(agent.ok());
  CHECK(wb::config::ControllerAddresses(agent->controller) ==
        std::vector<std::string>{"10.0.0.7:7100", "10.0.0.8:7100"});
  CHECK_THAT(ErrorOf("controller: 10.0.0.7:7100,nonsense\n"),
             Catch::Contains("controller") && Catch::Contains("comma-separated"));
  CHECK_THAT(ErrorOf("controller: ','\n"), Catch::Contains("controller"));
}
