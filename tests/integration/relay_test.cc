// Relays with real processes (issue 30): a controller, one trainer agent and four inference
// agents (one replica each) over loopback tcp, with relays forced in the controller's config as
// a chain (fan-out 1) and as a tree (fan-out 2). The trainer sends to the root replica only;
// every other replica gets its bytes from the replica before it, forwarded as they land. Every
// byte of every replica is compared with the trainer's, for several versions.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/controller_calls.h"
#include "tests/support/fp8_reference.h"
#include "tests/support/grpc_call.h"
#include "tests/support/one_tensor.h"
#include "tests/support/two_tensor_sides.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

constexpr int kReplicas = 4;
constexpr int64_t kRows = 2048, kCols = 1024;  // 4 MiB of BF16 per tensor, two tensors
constexpr uint64_t kTensorBytes = kRows * kCols * 2;

using wb::testing::two_tensors::Side;

Side Open(const std::string& socket, v1::Role role, int replica) {
  return wb::testing::two_tensors::OpenSide(socket, role, replica, kRows, kCols, "relay-side");
}

// An FP8 inference replica: a.weight BF16, b.weight FP8 e4m3 with its float32 128x128 block
// scales (b.weight_scale_inv), in one buffer.
constexpr int64_t kScaleRows = kRows / 128, kScaleCols = kCols / 128;
constexpr uint64_t kFp8Bytes = kRows * kCols, kScaleBytes = kScaleRows * kScaleCols * 4;
constexpr uint64_t kFp8SideBytes = kTensorBytes + kFp8Bytes + kScaleBytes;

Side OpenFp8(const std::string& socket, int replica) {
  auto b = SharedBuffer::Create(kFp8SideBytes, "relay-fp8");
  REQUIRE(b.ok());
  auto s = LocalSession::Connect(socket, Identity{v1::ROLE_INFERENCE, 0, replica});
  REQUIRE(s.ok());
  REQUIRE(
      s->Register(TensorInfo{"a.weight", v1::DTYPE_BF16, {kRows, kCols}, {}}, *b, 0, kTensorBytes)
          .ok());
  REQUIRE(s->Register(TensorInfo{"b.weight", v1::DTYPE_F8_E4M3, {kRows, kCols}, {}}, *b,
                      kTensorBytes, kFp8Bytes)
              .ok());
  REQUIRE(s->Register(TensorInfo{"b.weight_scale_inv", v1::DTYPE_F32, {kScaleRows, kScaleCols}, {}},
                      *b, kTensorBytes + kFp8Bytes, kScaleBytes)
              .ok());
  return Side{std::move(*b), std::move(*s)};
}

// What an FP8 replica must hold, from the trainer's BF16: a.weight as it is, b.weight
// quantized on the CPU with its block scales.
std::vector<uint8_t> ExpectedFp8Side(const Side& trainer) {
  std::vector<uint8_t> out(kFp8SideBytes);
  const auto* src = static_cast<const uint8_t*>(trainer.buffer.data());
  std::memcpy(out.data(), src, kTensorBytes);
  wb::testing::QuantizeFp8Blocks(src + kTensorBytes, kRows, kCols, out.data() + kTensorBytes,
                                 reinterpret_cast<float*>(out.data() + kTensorBytes + kFp8Bytes));
  return out;
}

// A controller, "trainer-node" and kReplicas inference agents "infer-R" (one replica each),
// relays forced as `roots` sender-fed replicas and fan-out `fanout`; both sides registered and
// the world planned.
struct Fleet {
  std::unique_ptr<Cluster> cluster;
  std::optional<Side> trainer;
  std::vector<Side> replicas;
  std::optional<ControllerClient> ctl;
  v1::PlanSummary plan;

  explicit Fleet(int fanout, const std::string& trainer_yaml = "", bool fp8 = false,
                 const std::string& controller_yaml = "") {
    wb::testing::ClusterOptions options;
    options.agents = {"trainer-node"};
    for (int r = 0; r < kReplicas; ++r) options.agents.push_back("infer-" + std::to_string(r));
    options.inference_replicas = kReplicas;
    options.extra_controller_yaml =
        "relays:\n  enabled: true\n  roots: 1\n  fanout: " + std::to_string(fanout) + "\n" +
        controller_yaml;
    if (!trainer_yaml.empty()) options.agent_yaml["trainer-node"] = trainer_yaml;
    cluster = std::make_unique<Cluster>(wb::testing::Runfile(""), options);
    trainer.emplace(Open(cluster->socket("trainer-node"), v1::ROLE_TRAINER, 0));
    for (int r = 0; r < kReplicas; ++r) {
      const std::string socket = cluster->socket("infer-" + std::to_string(r));
      replicas.push_back(fp8 ? OpenFp8(socket, r) : Open(socket, v1::ROLE_INFERENCE, r));
    }
    ctl.emplace(wb::testing::ConnectController(*cluster));
    plan = wb::testing::PlanWorld(&*ctl, wb::testing::World(1, kReplicas, 1));
  }
  bool Same(int replica) const {
    return std::memcmp(replicas[replica].buffer.data(), trainer->buffer.data(), 2 * kTensorBytes) ==
           0;
  }
};

void Fill(Side* trainer, uint32_t version) {
  auto* p = static_cast<uint16_t*>(trainer->buffer.data());
  for (uint64_t i = 0; i < 2 * kTensorBytes / 2; ++i) {
    p[i] = static_cast<uint16_t>(0x3c00 + ((i * 11 + version * 17) & 0x3ff));
  }
}

}  // namespace

TEST_CASE("relays: a chain and a tree over four replicas deliver every byte to every replica") {
  const int fanout = GENERATE(1, 2);
  INFO("fan-out " << fanout);
  Fleet f(fanout);
  Side& trainer = *f.trainer;
  ControllerClient& ctl = *f.ctl;
  const v1::PlanSummary& plan = f.plan;
  CHECK(plan.relay_roots() == 1);
  CHECK(plan.relay_fanout() == fanout);
  // Every replica's bytes move once: the trainer's to the root, the relays' to the others.
  CHECK(plan.total_bytes() == kReplicas * 2 * kTensorBytes);

  for (uint32_t v = 1; v <= 3; ++v) {
    Fill(&trainer, v);
    const v1::StepResult step = wb::testing::RequireCommitted(ctl.Step(v));
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
    // The trainer fed the root replica only; the relays forwarded the other three's bytes.
    CHECK(trainer_bytes == 2 * kTensorBytes);
    CHECK(relayed_bytes == (kReplicas - 1) * 2 * kTensorBytes);
    CHECK(relays == (fanout == 1 ? 3 : 2));  // chain: 0 -> 1 -> 2 -> 3; tree: 0 -> {1, 2}, 1 -> 3
    for (int r = 0; r < kReplicas; ++r) {
      INFO("replica " << r << " version " << v);
      CHECK(f.Same(r));
    }
  }
}

TEST_CASE("relays: FP8 replicas get their quantized bytes and scales from the relay before them") {
  const int fanout = GENERATE(1, 2);
  INFO("fan-out " << fanout);
  Fleet f(fanout, "", /*fp8=*/true);
  for (uint32_t v = 1; v <= 2; ++v) {
    Fill(&*f.trainer, v);
    const v1::StepResult step = wb::testing::RequireCommitted(f.ctl->Step(v));
    CHECK(step.committed_replicas_size() == kReplicas);
    uint64_t trainer_bytes = 0;
    for (const v1::AgentStepReport& a : step.agents()) {
      if (a.agent() == "trainer-node") trainer_bytes += a.bytes_sent();
    }
    CHECK(trainer_bytes == kFp8SideBytes);  // the root's bytes only; the relays forward the rest
    const std::vector<uint8_t> want = ExpectedFp8Side(*f.trainer);
    for (int r = 0; r < kReplicas; ++r) {
      INFO("replica " << r << " version " << v);
      const auto* got = static_cast<const uint8_t*>(f.replicas[r].buffer.data());
      CHECK(std::memcmp(got, want.data(), kTensorBytes) == 0);
      CHECK(std::memcmp(got + kTensorBytes, want.data() + kTensorBytes, kFp8Bytes) == 0);
      CHECK(std::memcmp(got + kTensorBytes + kFp8Bytes, want.data() + kTensorBytes + kFp8Bytes,
                        kScaleBytes) == 0);
    }
  }
}

TEST_CASE("relays in delta mode: the roots apply the deltas, the relays forward the result") {
  const int fanout = GENERATE(1, 2);
  INFO("fan-out " << fanout);
  Fleet f(fanout, "", /*fp8=*/true, "delta:\n  enabled: true\n  verify: true\n  anchor_every: 4\n");
  REQUIRE(f.plan.delta().enabled());
  CHECK(f.plan.relay_fanout() == fanout);
  // A sparse update: one element in 64 changes from one version to the next.
  auto fill_sparse = [&](uint32_t version) {
    auto* p = static_cast<uint16_t*>(f.trainer->buffer.data());
    for (uint64_t i = 0; i < 2 * kTensorBytes / 2; ++i) {
      const uint64_t bump = i % 64 == 0 ? version * 3 : 0;
      p[i] = static_cast<uint16_t>(0x3c00 + ((i * 11 + bump) & 0x3ff));
    }
  };
  int delta_steps = 0;
  for (uint32_t v = 1; v <= 6; ++v) {
    fill_sparse(v);
    const v1::StepResult step = wb::testing::RequireCommitted(f.ctl->Step(v));
    CHECK(step.committed_replicas_size() == kReplicas);
    uint64_t trainer_sent = 0, trainer_dense = 0, relayed = 0;
    for (const v1::AgentStepReport& a : step.agents()) {
      if (a.agent() == "trainer-node") {
        trainer_sent += a.bytes_sent();
        trainer_dense += a.bytes_dense();
      } else {
        relayed += a.bytes_sent();
      }
    }
    // The trainer feeds the root only; every other replica gets the applied bytes, dense.
    CHECK(trainer_dense == kFp8SideBytes);
    CHECK(relayed == (kReplicas - 1) * kFp8SideBytes);
    INFO("version " << v << ": anchor " << step.delta_anchor() << ", " << step.delta_ops()
                    << " delta ops, " << step.replanned());
    if (!step.delta_anchor() && step.delta_ops() > 0) {
      ++delta_steps;
      CHECK(trainer_sent < kFp8SideBytes / 4);
    }
    const std::vector<uint8_t> want = ExpectedFp8Side(*f.trainer);
    for (int r = 0; r < kReplicas; ++r) {
      INFO("replica " << r << " version " << v);
      CHECK(std::memcmp(f.replicas[r].buffer.data(), want.data(), kFp8SideBytes) == 0);
    }
  }
  CHECK(delta_steps >= 3);  // anchors at 1 and 5, deltas between
}

TEST_CASE(
    "relays: a relay killed or frozen: the senders feed its children that step; back, all "
    "catch up") {
  const int sig = GENERATE(SIGKILL, SIGSTOP);
  // With time: the senders feed the dropped relay's child directly. Without (the cost model
  // rates the links so slow that the plan's step takes longer than half the deadline): its
  // subtree waits for the next step.
  const bool time_left = GENERATE(true, false);
  INFO((sig == SIGKILL ? "killed" : "frozen") << (time_left ? "" : ", no time left"));
  Fleet f(1, "", /*fp8=*/false,
          time_left ? "" : "cost_model:\n  nic_gbps: 0.001\n  op_overhead_us: 1000000\n");
  Cluster& cluster = *f.cluster;
  Side& trainer = *f.trainer;
  std::vector<Side>& replicas = f.replicas;
  ControllerClient& ctl = *f.ctl;
  Fill(&trainer, 1);
  CHECK(wb::testing::RequireCommitted(ctl.Step(1)).committed_replicas_size() == kReplicas);

  // The chain is 0 -> 1 -> 2 -> 3. With relay 1 gone the trainer feeds replica 2 itself, which
  // still relays to 3: only replica 1 is skipped. Without the time for it, 1, 2 and 3 are.
  cluster.KillAgent("infer-1", sig);
  Fill(&trainer, 2);
  const v1::StepResult step = wb::testing::RequireCommitted(ctl.Step(2));
  std::set<int> skipped;
  for (const auto& s : step.skipped_replicas()) skipped.insert(s.replica());
  uint64_t trainer_bytes = 0;
  for (const v1::AgentStepReport& a : step.agents()) {
    if (a.agent() == "trainer-node") trainer_bytes += a.bytes_sent();
  }
  CHECK(f.Same(0));
  if (time_left) {
    CHECK(skipped == std::set<int>{1});
    CHECK(step.committed_replicas_size() == 3);
    CHECK(trainer_bytes == 2 * 2 * kTensorBytes);  // the root and, directly, replica 2
    CHECK(f.Same(2));
    CHECK(f.Same(3));  // relayed by 2 from what the trainer wrote into it
  } else {
    CHECK(skipped == std::set<int>{1, 2, 3});
    CHECK(step.committed_replicas_size() == 1);
    CHECK(trainer_bytes == 2 * kTensorBytes);
    bool named = false;
    for (const auto& s : step.skipped_replicas())
      named |= s.reason().find("relay infer-1") != std::string::npos;
    CHECK(named);  // the children say which relay they lost
  }

  // Back (restarted and registered again, or thawed): later steps reach every replica again.
  if (sig == SIGKILL) {
    REQUIRE(cluster.StartAgent("infer-1"));
    replicas[1] = Open(cluster.socket("infer-1"), v1::ROLE_INFERENCE, 1);
  } else {
    cluster.KillAgent("infer-1", SIGCONT);
  }
  int committed = 0;
  uint32_t v = 3;
  for (; v < 30 && committed < kReplicas; ++v) {
    Fill(&trainer, v);
    auto again = ctl.Step(v);
    committed = again.ok() ? again->committed_replicas_size() : 0;
    if (committed < kReplicas) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  REQUIRE(committed == kReplicas);
  for (int r = 0; r < kReplicas; ++r) {
    INFO("replica " << r);
    CHECK(f.Same(r));
  }
}

TEST_CASE("relays: a relay killed mid-step: the others commit in that step, without a timeout") {
  // The trainer holds each op of version 2 for 400 ms, so the step is still running when the
  // middle of the chain 0 -> 1 -> 2 -> 3 dies.
  Fleet f(1, "executor:\n  test_hold_version: 2\n  test_hold_ms: 400\n");
  Fill(&*f.trainer, 1);
  CHECK(wb::testing::RequireCommitted(f.ctl->Step(1)).committed_replicas_size() == kReplicas);

  Fill(&*f.trainer, 2);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    f.cluster->KillAgent("infer-1", SIGKILL);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto result = f.ctl->Step(2);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  killer.join();
  const v1::StepResult step = wb::testing::RequireCommitted(result);
  // Replica 2's relay ops stop waiting as soon as infer-1's connections end; the senders then
  // run again, feeding replica 2 themselves, and 2 relays to 3 again: only 1 is skipped.
  std::set<int> skipped;
  for (const auto& s : step.skipped_replicas()) skipped.insert(s.replica());
  CHECK(skipped == std::set<int>{1});
  CHECK(step.committed_replicas_size() == 3);
  CHECK(f.Same(0));
  CHECK(f.Same(2));
  CHECK(f.Same(3));
  // Decided long before the step's deadline.
  CHECK(seconds < 10);  // the deadline is 20 s (tests/support/cluster.cc)
}

// Issue 41, item 6: an agent's skip set (the fallback ops' destinations the controller did not
// name) applied to relay ops too, so a relay that also sent its own bytes would have committed
// its children's version with none of its bytes. A relay never sends: the plan loader refuses
// a plan that breaks it, and the planner never makes an agent holding trainer tensors a relay.
TEST_CASE("relays: a trainer and a replica on one agent; every replica holds every byte") {
  wb::testing::ClusterOptions options;
  options.agents = {"node-a"};  // the trainer and replica 0
  for (int r = 1; r < kReplicas; ++r) options.agents.push_back("infer-" + std::to_string(r));
  options.inference_replicas = kReplicas;
  options.extra_controller_yaml = "relays:\n  enabled: true\n  roots: 1\n  fanout: 1\n";
  Cluster cluster(wb::testing::Runfile(""), options);
  Side trainer = Open(cluster.socket("node-a"), v1::ROLE_TRAINER, 0);
  std::vector<Side> replicas;
  replicas.push_back(Open(cluster.socket("node-a"), v1::ROLE_INFERENCE, 0));
  for (int r = 1; r < kReplicas; ++r) {
    replicas.push_back(Open(cluster.socket("infer-" + std::to_string(r)), v1::ROLE_INFERENCE, r));
  }
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  const v1::PlanSummary plan = wb::testing::PlanWorld(&ctl, wb::testing::World(1, kReplicas, 1));
  CHECK(plan.relay_roots() == 1);
  for (uint32_t v = 1; v <= 3; ++v) {
    Fill(&trainer, v);
    auto r = ctl.Step(v);
    INFO("version " << v << ": " << (r.ok() ? "" : std::string(r.status().message())));
    REQUIRE(r.ok());
    CHECK(r->committed_replicas_size() == kReplicas);
    for (int k = 0; k < kReplicas; ++k) {
      INFO("replica " << k);
      CHECK(std::memcmp(replicas[k].buffer.data(), trainer.buffer.data(), 2 * kTensorBytes) == 0);
    }
  }
}

TEST_CASE("relays: the plan loader refuses a plan that makes a sender a relay, naming the rule") {
  wb::testing::ClusterOptions options;
  options.agents = {"trainer-node", "infer-0"};
  Cluster cluster(wb::testing::Runfile(""), options);
  auto stub = v1::Agent::NewStub(
      grpc::CreateChannel(cluster.agent_address("infer-0"), grpc::InsecureChannelCredentials()));
  v1::LoadPlanRequest req;
  v1::AgentPlan* plan = req.mutable_plan();
  plan->set_agent("infer-0");
  plan->set_plan_id(999);
  auto add = [&](bool relay) {
    v1::TransferOp* op = plan->add_ops();
    op->set_op_id(plan->ops_size());
    op->set_src_tensor("a.weight");
    op->set_dst_agent("infer-1");
    op->set_rows(1);
    op->set_row_elems(64);
    op->set_src_dtype(v1::DTYPE_BF16);
    op->set_dst_dtype(v1::DTYPE_BF16);
    op->set_transform(v1::TRANSFORM_COPY);
    op->set_relay(relay);
  };
  add(true);   // forwards what lands here
  add(false);  // and sends bytes of its own
  v1::LoadPlanResponse resp;
  const grpc::Status s = wb::testing::CallWithin(std::chrono::milliseconds(20000), stub.get(),
                                                 &v1::Agent::Stub::LoadPlan, req, &resp);
  wb::testing::CheckRefused(s, grpc::StatusCode::FAILED_PRECONDITION, "a relay never sends");
  CHECK_THAT(s.error_message(), Catch::Contains("plan 999") && Catch::Contains("infer-0"));
}
