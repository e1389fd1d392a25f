// Capture, then send (issue 29, trainer side) with real processes: a controller and two agents
// over loopback tcp; the trainer agent has a capture budget (capture.max_bytes). The trainer
// holds a.weight and b.weight (BF16); the inference side a.weight (BF16) and b.weight as FP8
// e4m3 with its block scales. After StepAsync's WaitCaptured the trainer overwrites its tensors
// at once, and every byte that lands must still be the captured version's: the expectation is
// computed here from the version's generator, never read back from the trainer. A step asked
// for while the previous one still sends captures at once with two slots and after that send
// with one; a plan whose capture does not fit the budget is refused naming both numbers; a
// sender killed after capturing fails its step naming it.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/controller_calls.h"
#include "tests/support/fp8_reference.h"
#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using std::chrono::milliseconds;
using wb::testing::Cluster;

namespace {

constexpr int64_t kRows = 1000, kCols = 2000;  // ragged 128x128 blocks
constexpr uint64_t kElems = kRows * kCols;
constexpr uint64_t kTrainerBytes = 2 * kElems * 2;  // what one capture holds: both tensors
constexpr int64_t kScaleRows = (kRows + 127) / 128, kScaleCols = (kCols + 127) / 128;
constexpr uint64_t kScaleBytes = kScaleRows * kScaleCols * 4;

// Version `v`'s BF16 value of element `i` of tensor `t` (positive normal numbers). Between
// versions only every 50th element moves, so delta mode sends packed deltas.
uint16_t Value(int t, uint64_t i, uint64_t v) {
  const uint64_t k = i % 50 == 0 ? v * 7 : 0;
  return static_cast<uint16_t>(0x3c00 + ((i * 11 + t * 5 + k) & 0x3ff));
}
// Bytes the trainer must never send: written right after each capture.
uint16_t Scribble(uint64_t i) { return static_cast<uint16_t>(0x4400 + (i & 0xff)); }

TensorInfo Info(const std::string& name, v1::DType dtype, int64_t rows, int64_t cols) {
  return TensorInfo{name, dtype, {rows, cols}, {}};
}

struct Trainer {
  SharedBuffer buffer;  // a.weight then b.weight, BF16
  LocalSession session;
  uint16_t* Tensor(int t) { return static_cast<uint16_t*>(buffer.data()) + t * kElems; }
  void Write(uint64_t v) {
    for (int t = 0; t < 2; ++t) {
      uint16_t* p = Tensor(t);
      for (uint64_t i = 0; i < kElems; ++i) p[i] = Value(t, i, v);
    }
  }
  void Scribble() {
    for (int t = 0; t < 2; ++t) {
      uint16_t* p = Tensor(t);
      for (uint64_t i = 0; i < kElems; ++i) p[i] = ::Scribble(i);
    }
  }
};

Trainer OpenTrainer(const std::string& socket) {
  auto buf = SharedBuffer::Create(kTrainerBytes, "capture-trainer");
  REQUIRE(buf.ok());
  auto s = LocalSession::Connect(socket, Identity{v1::ROLE_TRAINER, 0, 0});
  REQUIRE(s.ok());
  Trainer t{std::move(*buf), std::move(*s)};
  t.Write(0);
  REQUIRE(
      t.session.Register(Info("a.weight", v1::DTYPE_BF16, kRows, kCols), t.buffer, 0, kElems * 2)
          .ok());
  REQUIRE(t.session
              .Register(Info("b.weight", v1::DTYPE_BF16, kRows, kCols), t.buffer, kElems * 2,
                        kElems * 2)
              .ok());
  return t;
}

struct Inference {
  SharedBuffer buffer;  // a.weight BF16, b.weight FP8 e4m3, b.weight's scales
  LocalSession session;
  uint8_t* A() { return static_cast<uint8_t*>(buffer.data()); }
  uint8_t* B() { return A() + kElems * 2; }
  uint8_t* Scales() { return B() + kElems; }
};

Inference OpenInference(const std::string& socket, int replica = 0) {
  auto buf = SharedBuffer::Create(kElems * 3 + kScaleBytes, "capture-inference");
  REQUIRE(buf.ok());
  auto s = LocalSession::Connect(socket, Identity{v1::ROLE_INFERENCE, 0, replica});
  REQUIRE(s.ok());
  Inference inf{std::move(*buf), std::move(*s)};
  REQUIRE(inf.session
              .Register(Info("a.weight", v1::DTYPE_BF16, kRows, kCols), inf.buffer, 0, kElems * 2)
              .ok());
  REQUIRE(inf.session
              .Register(Info("b.weight", v1::DTYPE_F8_E4M3, kRows, kCols), inf.buffer, kElems * 2,
                        kElems)
              .ok());
  REQUIRE(inf.session
              .Register(Info("b.weight_scale_inv", v1::DTYPE_F32, kScaleRows, kScaleCols),
                        inf.buffer, kElems * 3, kScaleBytes)
              .ok());
  return inf;
}

// The inference side must hold exactly version `v`: a.weight as generated, b.weight quantized
// here to FP8 with 128x128 block scales from the generated values.
void CheckHolds(Inference& inf, uint64_t v) {
  INFO("version " << v);
  std::vector<uint16_t> a(kElems), b(kElems);
  for (uint64_t i = 0; i < kElems; ++i) {
    a[i] = Value(0, i, v);
    b[i] = Value(1, i, v);
  }
  CHECK(std::memcmp(inf.A(), a.data(), kElems * 2) == 0);
  std::vector<uint8_t> fp8(kElems);
  std::vector<float> scales(kScaleRows * kScaleCols);
  wb::testing::QuantizeFp8Blocks(b.data(), kRows, kCols, fp8.data(), scales.data());
  CHECK(std::memcmp(inf.B(), fp8.data(), kElems) == 0);
  CHECK(std::memcmp(inf.Scales(), scales.data(), kScaleBytes) == 0);
}

std::string Capture(uint64_t max_bytes) {
  return "capture:\n  max_bytes: " + std::to_string(max_bytes) + "\n";
}
// The trainer's write stage holds every op of `version` for `ms` (a slow send).
std::string Hold(uint64_t version, int ms) {
  return "executor:\n  test_hold_version: " + std::to_string(version) +
         "\n  test_hold_ms: " + std::to_string(ms) + "\n";
}

struct Fleet {
  std::unique_ptr<Cluster> cluster;
  std::optional<Trainer> trainer;
  std::optional<Inference> inference;
  std::optional<ControllerClient> ctl;

  Fleet(const std::string& trainer_yaml, const std::string& controller_yaml = "") {
    wb::testing::ClusterOptions opts;
    opts.agent_yaml["trainer-node"] = trainer_yaml;
    opts.extra_controller_yaml = controller_yaml;
    cluster = std::make_unique<Cluster>(wb::testing::Runfile(""), opts);
    trainer.emplace(OpenTrainer(cluster->socket("trainer-node")));
    inference.emplace(OpenInference(cluster->socket("inference-node")));
    ctl.emplace(wb::testing::ConnectController(*cluster));
  }
};

std::unique_ptr<ControllerClient::StepHandle> Start(ControllerClient& ctl, uint64_t v) {
  return std::make_unique<ControllerClient::StepHandle>(ctl.StepAsync(v, milliseconds(30000)));
}

v1::StepCaptured RequireCaptured(ControllerClient::StepHandle& h) {
  auto c = h.WaitCaptured(milliseconds(30000));
  INFO((c.ok() ? "" : std::string(c.status().message())));
  REQUIRE(c.ok());
  return *c;
}

v1::StepResult RequireResult(ControllerClient::StepHandle& h) {
  auto r = h.Result(milliseconds(60000));
  INFO((r.ok() ? "" : std::string(r.status().message())));
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("capture: the trainer overwrites its tensors right after capture; each version lands") {
  const bool delta = GENERATE(false, true);
  INFO((delta ? "delta mode" : "dense"));
  // Version 2's send is slow (every op held 700 ms): the overwrite surely comes before it.
  Fleet f(Capture(2 * kTrainerBytes) + Hold(2, 700),
          delta ? "delta:\n  enabled: true\n  anchor_every: 3\n  verify: true\n" : "");
  ControllerClient& ctl = *f.ctl;
  auto plan = ctl.Plan(wb::testing::World(1, 1, 1), milliseconds(20000),
                       delta ? v1::DELTA_CHOICE_ON : v1::DELTA_CHOICE_OFF);
  INFO((plan.ok() ? "" : std::string(plan.status().message())));
  REQUIRE(plan.ok());
  CHECK(plan->delta().enabled() == delta);
  bool sent_deltas = false;
  for (uint64_t v = 1; v <= 5; ++v) {
    f.trainer->Write(v);
    auto h = Start(ctl, v);
    const v1::StepCaptured c = RequireCaptured(*h);
    f.trainer->Scribble();  // the next iteration's weights, before the step has sent
    CHECK(c.version() == v);
    CHECK(c.how() == "captured");
    const v1::StepResult r = RequireResult(*h);
    CHECK(r.capture() == "captured");
    CHECK(r.trainer_stall_seconds() > 0);
    CHECK(r.trainer_stall_seconds() < r.seconds());
    if (v == 2) CHECK(r.seconds() - r.trainer_stall_seconds() > 1.0);  // it sent after
    for (const auto& a : r.agents()) {
      if (a.agent() != "trainer-node") continue;
      CHECK(a.capture_bytes() == kTrainerBytes);
    }
    sent_deltas = sent_deltas || r.delta_ops() > 0;
    CheckHolds(*f.inference, v);
  }
  CHECK(sent_deltas == delta);
}

TEST_CASE("capture: off, a step reads in place and says so") {
  Fleet f("");
  ControllerClient& ctl = *f.ctl;
  wb::testing::PlanOneToOne(&ctl);
  f.trainer->Write(1);
  auto h = Start(ctl, 1);
  const v1::StepResult r = RequireResult(*h);
  const v1::StepCaptured c = RequireCaptured(*h);
  CHECK(c.how() == "in place");
  CHECK(r.capture() == "in place");
  CHECK(r.trainer_stall_seconds() == r.seconds());
  CheckHolds(*f.inference, 1);
}

TEST_CASE("capture: a step asked for while the previous one sends captures at once or after it") {
  const int slots = GENERATE(2, 1);
  INFO(slots << " capture slot(s)");
  // Exactly one or two captures fit the budget; version 2's send takes about 1.6 s.
  Fleet f(Capture(slots * kTrainerBytes + kTrainerBytes / 2) + Hold(2, 800));
  ControllerClient& ctl = *f.ctl;
  wb::testing::PlanOneToOne(&ctl);
  f.trainer->Write(1);
  RequireResult(*Start(ctl, 1));
  CheckHolds(*f.inference, 1);

  f.trainer->Write(2);
  auto h2 = Start(ctl, 2);
  CHECK(RequireCaptured(*h2).how() == "captured");
  f.trainer->Write(3);
  const auto asked = std::chrono::steady_clock::now();
  auto h3 = Start(ctl, 3);
  const v1::StepCaptured c3 = RequireCaptured(*h3);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
  // Is version 2 still sending when version 3 has captured?
  const bool two_sending = !h2->Result(milliseconds(0)).ok();
  // Two slots: a third step, while 2 sends and 3 waits to send, waits for 2's send to capture.
  uint64_t last = 3;
  std::unique_ptr<ControllerClient::StepHandle> h4;
  if (slots == 2) {
    f.trainer->Write(4);
    h4 = Start(ctl, 4);
    CHECK(RequireCaptured(*h4).how() == "captured after step 2's send");
    last = 4;
  }
  f.trainer->Scribble();
  const v1::StepResult r2 = RequireResult(*h2);
  const v1::StepResult r3 = RequireResult(*h3);
  CHECK(r2.capture() == "captured");
  if (slots == 2) {
    CHECK(c3.how() == "captured");
    CHECK(r3.capture() == "captured");
    CHECK(two_sending);
    CHECK(waited < 1.0);
    CHECK(RequireResult(*h4).capture() == "captured after step 2's send");
  } else {
    CHECK(c3.how() == "captured after step 2's send");
    CHECK(r3.capture() == "captured after step 2's send");
    CHECK(waited > 1.0);
  }
  CHECK(r3.trainer_stall_seconds() == Approx(c3.seconds()));
  CheckHolds(*f.inference, last);
  // And the pipeline is empty again: a plain step after it.
  f.trainer->Write(last + 1);
  auto plain = ctl.Step(last + 1);
  INFO((plain.ok() ? "" : std::string(plain.status().message())));
  REQUIRE(plain.ok());
  CHECK(plain->capture() == "captured");
  CheckHolds(*f.inference, last + 1);
}

TEST_CASE("capture: a plan whose capture does not fit the budget is refused, naming both") {
  Fleet f(Capture(kTrainerBytes - 1));
  auto plan = f.ctl->Plan(wb::testing::World(1, 1, 1), milliseconds(20000));
  REQUIRE_FALSE(plan.ok());
  const std::string msg(plan.status().message());
  INFO(msg);
  CHECK_THAT(msg, Catch::Contains("trainer-node"));
  CHECK_THAT(msg, Catch::Contains(std::to_string(kTrainerBytes) + " bytes"));
  CHECK_THAT(msg, Catch::Contains("capture.max_bytes = " + std::to_string(kTrainerBytes - 1)));
  // Nothing was skipped silently: no plan, so no step.
  CHECK_FALSE(f.ctl->Step(1).ok());
}

TEST_CASE("capture: a sender killed after capturing fails its step, naming it") {
  Fleet f(Capture(2 * kTrainerBytes) + Hold(1, 3000));
  ControllerClient& ctl = *f.ctl;
  wb::testing::PlanOneToOne(&ctl);
  f.trainer->Write(1);
  auto h = Start(ctl, 1);
  RequireCaptured(*h);
  f.cluster->KillAgent("trainer-node", SIGKILL);
  auto r = h->Result(milliseconds(60000));
  REQUIRE_FALSE(r.ok());
  INFO(r.status().message());
  CHECK_THAT(std::string(r.status().message()), Catch::Contains("trainer-node"));
}

TEST_CASE("capture: with relays, the relay forwards what the trainer sent from its capture") {
  wb::testing::ClusterOptions opts;
  opts.agents = {"trainer-node", "infer-0", "infer-1"};
  opts.inference_replicas = 2;
  opts.agent_yaml["trainer-node"] = Capture(2 * kTrainerBytes) + Hold(2, 500);
  opts.extra_controller_yaml = "relays:\n  enabled: true\n  roots: 1\n  fanout: 1\n";
  Cluster cluster(wb::testing::Runfile(""), opts);
  Trainer trainer = OpenTrainer(cluster.socket("trainer-node"));
  std::vector<Inference> replicas;
  for (int r = 0; r < 2; ++r) {
    replicas.push_back(OpenInference(cluster.socket("infer-" + std::to_string(r)), r));
  }
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  const v1::PlanSummary plan = wb::testing::PlanWorld(&ctl, wb::testing::World(1, 2, 1));
  CHECK(plan.relay_roots() == 1);
  for (uint64_t v = 1; v <= 3; ++v) {
    trainer.Write(v);
    auto h = Start(ctl, v);
    CHECK(RequireCaptured(*h).how() == "captured");
    trainer.Scribble();
    const v1::StepResult r = RequireResult(*h);
    CHECK(r.capture() == "captured");
    CHECK(r.committed_replicas_size() == 2);
    for (auto& inf : replicas) CheckHolds(inf, v);
  }
}

namespace {

// An inference rank holding one of the trainer's tensors, BF16 (a plain copy of it).
struct OneTensorRank {
  SharedBuffer buffer;
  LocalSession session;
  bool Holds(int t, uint64_t v) const {
    const auto* p = static_cast<const uint16_t*>(buffer.data());
    for (uint64_t i = 0; i < kElems; ++i) {
      if (p[i] != Value(t, i, v)) return false;
    }
    return true;
  }
};

// Inference rank `rank` of `replica` registers tensor `rank` (a.weight or b.weight).
OneTensorRank OpenRank(const std::string& socket, int replica, int rank) {
  auto buf = SharedBuffer::Create(kElems * 2, "capture-rank");
  REQUIRE(buf.ok());
  auto s = LocalSession::Connect(socket, Identity{v1::ROLE_INFERENCE, rank, replica});
  REQUIRE(s.ok());
  OneTensorRank r{std::move(*buf), std::move(*s)};
  REQUIRE(r.session
              .Register(Info(rank == 0 ? "a.weight" : "b.weight", v1::DTYPE_BF16, kRows, kCols),
                        r.buffer, 0, kElems * 2)
              .ok());
  return r;
}

}  // namespace

TEST_CASE("capture: a capture still running when its step is aborted ends discarded") {
  // Every capture takes 2.5 s (the test hook, as tens of GB would); version 1's step has 1 s.
  Fleet f("capture:\n  max_bytes: " + std::to_string(2 * kTrainerBytes) +
          "\n  test_delay_ms: 2500\n");
  ControllerClient& ctl = *f.ctl;
  wb::testing::PlanOneToOne(&ctl);
  f.trainer->Write(1);
  auto r1 = ctl.StepAsync(1, milliseconds(1000)).Result(milliseconds(60000));
  REQUIRE_FALSE(r1.ok());
  INFO("version 1: " << r1.status().message());
  // The capture stopped at its deadline (and at the abort): its slot takes the next step's
  // capture at once, and every later step commits.
  for (uint64_t v = 2; v <= 3; ++v) {
    f.trainer->Write(v);
    auto h = Start(ctl, v);
    const v1::StepResult r = RequireResult(*h);
    CHECK(r.capture() == "captured");
    CheckHolds(*f.inference, v);
  }
  const std::string log = f.cluster->Log("trainer-node");
  CHECK_THAT(log, !Catch::Contains("version 1: captured"));  // it never finished as captured
}

TEST_CASE("capture: an agent that sends and receives keeps its capture when its replica drops") {
  // node-a holds the trainer and rank 0 of replica 0; infer-0b rank 1 of replica 0; infer-1
  // both ranks of replica 1. infer-0b dies before the step: replica 0 leaves the step at begin,
  // and node-a, aborted as its receiver, still sends replica 1 its bytes from its capture.
  wb::testing::ClusterOptions opts;
  opts.agents = {"node-a", "infer-0b", "infer-1"};
  opts.inference_replicas = 2;
  opts.inference_ranks_per_replica = 2;
  opts.agent_yaml["node-a"] = Capture(2 * kTrainerBytes);
  Cluster cluster(wb::testing::Runfile(""), opts);
  Trainer trainer = OpenTrainer(cluster.socket("node-a"));
  OneTensorRank a0 = OpenRank(cluster.socket("node-a"), 0, 0);
  OneTensorRank b0 = OpenRank(cluster.socket("infer-0b"), 0, 1);
  OneTensorRank a1 = OpenRank(cluster.socket("infer-1"), 1, 0);
  OneTensorRank b1 = OpenRank(cluster.socket("infer-1"), 1, 1);
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanWorld(&ctl, wb::testing::World(1, 2, 2));
  trainer.Write(1);
  auto first = ctl.Step(1);
  INFO((first.ok() ? "" : std::string(first.status().message())));
  REQUIRE(first.ok());
  CHECK(first->committed_replicas_size() == 2);
  CHECK((a0.Holds(0, 1) && b0.Holds(1, 1) && a1.Holds(0, 1) && b1.Holds(1, 1)));

  cluster.KillAgent("infer-0b", SIGKILL);
  trainer.Write(2);
  auto h = Start(ctl, 2);
  RequireCaptured(*h);
  trainer.Scribble();
  const v1::StepResult r = RequireResult(*h);
  CHECK(r.capture() == "captured");
  REQUIRE(r.committed_replicas_size() == 1);
  CHECK(r.committed_replicas(0) == 1);
  CHECK(a1.Holds(0, 2));
  CHECK(b1.Holds(1, 2));
  CHECK(a0.Holds(0, 1));  // replica 0 left the step: its bytes stay version 1's
}
