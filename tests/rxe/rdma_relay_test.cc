// Relays over rdma (issue 30), with real processes on Soft-RoCE (run inside tests/rxe/vm.sh by
// in_vm_suite.sh): a controller, a trainer agent and four inference agents (one replica each),
// every agent with rdma on rxe0 (preferred over tcp between agents), relays forced as a chain
// trainer -> infer-0 -> infer-1 -> infer-2 -> infer-3 (fan-out 1) and as a tree trainer ->
// infer-0 -> {infer-1 -> infer-3, infer-2} (fan-out 2). The trainer feeds the root only; each relay
// forwards the bytes that landed in it by one-sided writes, which it learns of from the landing
// notices (daemon/transport/rdma/landing_notice.h). Every byte of every replica is compared with
// the trainer's over several versions, the relays' forwarded bytes are checked in the step results,
// and rxe0's packet counter shows the bytes went over rdma, not tcp.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/controller_calls.h"
#include "tests/support/one_tensor.h"
#include "tests/support/two_tensor_sides.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

constexpr int kReplicas = 4;
constexpr int64_t kRows = 256, kCols = 512;  // 256 KiB of BF16 per tensor, two tensors
constexpr uint64_t kTensorBytes = kRows * kCols * 2;

using wb::testing::two_tensors::Side;

Side Open(const std::string& socket, v1::Role role, int replica) {
  return wb::testing::two_tensors::OpenSide(socket, role, replica, kRows, kCols, "rdma-relay");
}

void Fill(Side* trainer, uint32_t version) {
  auto* p = static_cast<uint16_t*>(trainer->buffer.data());
  for (uint64_t i = 0; i < 2 * kTensorBytes / 2; ++i) {
    p[i] = static_cast<uint16_t>(0x3c00 + ((i * 13 + version * 29) & 0x3ff));
  }
}

uint64_t SentPackets(const std::string& device) {
  std::ifstream in("/sys/class/infiniband/" + device + "/ports/1/hw_counters/sent_pkts");
  uint64_t n = 0;
  in >> n;
  return n;
}

}  // namespace

TEST_CASE("relays over rdma: a chain and a tree of four replicas on rxe0 get every byte") {
  const int fanout = GENERATE(1, 2);
  INFO("fan-out " << fanout);
  wb::testing::ClusterOptions options;
  options.agents = {"trainer-node"};
  for (int r = 0; r < kReplicas; ++r) options.agents.push_back("infer-" + std::to_string(r));
  options.inference_replicas = kReplicas;
  options.transports_yaml = "  rdma:\n    enabled: true\n    devices: [rxe0]\n";
  options.extra_controller_yaml =
      "relays:\n  enabled: true\n  roots: 1\n  fanout: " + std::to_string(fanout) + "\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  Side trainer = Open(cluster.socket("trainer-node"), v1::ROLE_TRAINER, 0);
  std::vector<Side> replicas;
  for (int r = 0; r < kReplicas; ++r) {
    replicas.push_back(Open(cluster.socket("infer-" + std::to_string(r)), v1::ROLE_INFERENCE, r));
  }
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  // Planning loads every agent's plan: an agent that refused relay ops over rdma fails it here.
  const v1::PlanSummary plan = wb::testing::PlanWorld(&ctl, wb::testing::World(1, kReplicas, 1));
  CHECK(plan.relay_roots() == 1);
  CHECK(plan.relay_fanout() == fanout);
  CHECK(plan.total_bytes() == kReplicas * 2 * kTensorBytes);

  for (uint32_t v = 1; v <= 3; ++v) {
    Fill(&trainer, v);
    const uint64_t packets_before = SentPackets("rxe0");
    const v1::StepResult step = wb::testing::RequireCommitted(ctl.Step(v));
    CHECK(step.committed_replicas_size() == kReplicas);
    uint64_t trainer_bytes = 0, relayed_bytes = 0;
    int relays = 0;
    for (const v1::AgentStepReport& a : step.agents()) {
      if (a.agent() == "trainer-node") {
        trainer_bytes += a.bytes_sent();
      } else if (a.bytes_sent() > 0) {
        relayed_bytes += a.bytes_sent();
        ++relays;
      }
    }
    INFO("version " << v);
    CHECK(trainer_bytes == 2 * kTensorBytes);  // the root's bytes only
    CHECK(relayed_bytes == (kReplicas - 1) * 2 * kTensorBytes);
    CHECK(relays == (fanout == 1 ? 3 : 2));  // chain: 0 -> 1 -> 2 -> 3; tree: 0 -> {1, 2}, 1 -> 3
    // Over rdma: at least one packet per 4 KiB (the largest MTU) of all four replicas' bytes.
    CHECK(SentPackets("rxe0") - packets_before >= kReplicas * 2 * kTensorBytes / 4096);
    for (int r = 0; r < kReplicas; ++r) {
      INFO("replica " << r);
      CHECK(std::memcmp(replicas[r].buffer.data(), trainer.buffer.data(), 2 * kTensorBytes) == 0);
    }
  }
}
