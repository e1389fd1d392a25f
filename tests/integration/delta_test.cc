// Delta mode end to end with real processes: a controller (delta on, anchors every 4 steps,
// verification on) and two agents over loopback tcp. A synthetic trainer applies Adam updates
// at lr 3e-6 to N(0, 0.02) weights and publishes BF16; the inference side holds one BF16 copy
// and one FP8 block-quantized copy (with scales). After every commit the test recomputes the
// expected destination bytes on its own and compares them bit for bit. A commit that fails
// with its deltas half applied, and a destination scribbled on by its owner, are both followed
// by a dense anchor step that puts every byte right (the second one retries the same version).
// Delta mode is then switched off and on again for later plans. A destination shrunk
// (ftruncate) under the receiving agent fails its commit, not the agent; a replica over two
// agents whose second agent's commit fails announces the version on neither.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/cluster.h"
#include "tests/support/fp8_reference.h"
#include "tests/support/one_tensor.h"
#include "tests/support/synthetic_adam.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

constexpr int64_t kRows = 1000, kCols = 2000;  // ragged 128x128 blocks
constexpr uint64_t kElems = kRows * kCols;
constexpr int64_t kScaleRows = (kRows + 127) / 128, kScaleCols = (kCols + 127) / 128;
constexpr uint64_t kScaleBytes = kScaleRows * kScaleCols * 4;
constexpr uint64_t kDense = kElems * 2 + kElems + kScaleBytes;  // BF16 copy + FP8 + scales
constexpr uint64_t kFailVersion = 6;

TensorInfo Info(const std::string& name, v1::DType dtype, int64_t rows, int64_t cols) {
  return TensorInfo{name, dtype, {rows, cols}, {}};
}

struct Trainer {
  SharedBuffer buffer;  // a.weight then b.weight, BF16
  LocalSession session;
  wb::testing::SyntheticAdam a{kElems, 0.02f, 1}, b{kElems, 0.02f, 2};

  uint16_t* A() { return static_cast<uint16_t*>(buffer.data()); }
  uint16_t* B() { return A() + kElems; }
  void Publish() {
    a.WriteBf16(A());
    b.WriteBf16(B());
  }
  void Step() {
    a.Step(3e-6f);
    b.Step(3e-6f);
    Publish();
  }
};

Trainer OpenTrainer(const std::string& socket) {
  auto buf = SharedBuffer::Create(2 * kElems * 2, "delta-trainer");
  REQUIRE(buf.ok());
  auto s = LocalSession::Connect(socket, Identity{v1::ROLE_TRAINER, 0, 0});
  REQUIRE(s.ok());
  Trainer t{std::move(*buf), std::move(*s)};
  t.Publish();
  REQUIRE(
      t.session.Register(Info("a.weight", v1::DTYPE_BF16, kRows, kCols), t.buffer, 0, kElems * 2)
          .ok());
  REQUIRE(t.session
              .Register(Info("b.weight", v1::DTYPE_BF16, kRows, kCols), t.buffer, kElems * 2,
                        kElems * 2)
              .ok());
  return t;
}

// Inference: a.weight BF16, b.weight FP8 e4m3 and its float32 block scales.
struct Inference {
  SharedBuffer buffer;
  LocalSession session;
  uint8_t* A() { return static_cast<uint8_t*>(buffer.data()); }
  uint8_t* B() { return A() + kElems * 2; }
  uint8_t* Scales() { return B() + kElems; }
};

Inference OpenInference(const std::string& socket) {
  auto buf = SharedBuffer::Create(kElems * 3 + kScaleBytes, "delta-inference");
  REQUIRE(buf.ok());
  auto s = LocalSession::Connect(socket, Identity{v1::ROLE_INFERENCE, 0, 0});
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
  REQUIRE(inf.session.Watch().ok());
  return inf;
}

// The expected destination, computed here from the trainer's BF16 values: a.weight as it is,
// b.weight quantized to FP8 e4m3 with 128x128 block scales on the CPU.
void CheckBitForBit(Trainer& t, Inference& inf, uint64_t version) {
  INFO("version " << version);
  CHECK(std::memcmp(inf.A(), t.A(), kElems * 2) == 0);
  std::vector<uint8_t> fp8(kElems);
  std::vector<float> scales(kScaleRows * kScaleCols);
  wb::testing::QuantizeFp8Blocks(t.B(), kRows, kCols, fp8.data(), scales.data());
  CHECK(std::memcmp(inf.B(), fp8.data(), kElems) == 0);
  CHECK(std::memcmp(inf.Scales(), scales.data(), kScaleBytes) == 0);
}

v1::Event NextEvent(Inference& inf) {
  auto e = inf.session.NextEvent(std::chrono::seconds(10));
  REQUIRE(e.ok());
  return *e;
}

}  // namespace

TEST_CASE("delta mode: Adam steps land bit for bit, anchors heal a failed and a scribbled step") {
  // The receiving agent fails the commit of kFailVersion after applying half of its slots.
  wb::testing::ClusterOptions opts;
  opts.extra_controller_yaml = "delta:\n  enabled: true\n  anchor_every: 4\n  verify: true\n";
  opts.agent_yaml["inference-node"] =
      "delta:\n  test_fail_commit_version: " + std::to_string(kFailVersion) + "\n";
  Cluster cluster(wb::testing::Runfile(""), opts);
  Trainer trainer = OpenTrainer(cluster.socket("trainer-node"));
  Inference inference = OpenInference(cluster.socket("inference-node"));
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  const v1::PlanSummary plan = wb::testing::PlanOneToOne(&ctl);
  CHECK(plan.delta().enabled());
  CHECK(plan.total_bytes() == kDense);

  // Commits one step; returns its result.
  auto commit = [&](uint64_t v) {
    auto step = ctl.Step(v);
    INFO("version " << v << ": " << (step.ok() ? "" : std::string(step.status().message())));
    REQUIRE(step.ok());
    CHECK(step->bytes_dense() == kDense);
    CHECK(NextEvent(inference).kind() == v1::Event::KIND_BEGIN);
    auto e = NextEvent(inference);
    CHECK(e.kind() == v1::Event::KIND_COMMIT);
    CHECK(e.version() == v);
    CheckBitForBit(trainer, inference, v);
    return *step;
  };
  // Steps version `v`, which must fail, and the watcher sees begin then abort; the error.
  auto failed_step = [&](uint64_t v) {
    auto step = ctl.Step(v);
    REQUIRE_FALSE(step.ok());
    CHECK(NextEvent(inference).kind() == v1::Event::KIND_BEGIN);
    CHECK(NextEvent(inference).kind() == v1::Event::KIND_ABORT);
    return std::string(step.status().message());
  };
  auto check_anchor = [](const v1::StepResult& r) {
    CHECK(r.delta_anchor());
    CHECK(r.bytes() == kDense);
    CHECK(r.delta_ops() == 0);
  };
  auto check_delta = [](const v1::StepResult& r) {
    INFO("version " << r.version() << ": sent " << r.bytes() << " of " << r.bytes_dense());
    CHECK_FALSE(r.delta_anchor());
    CHECK(r.delta_ops() > 0);
    CHECK(r.bytes() * 5 < r.bytes_dense());  // far below dense
  };

  check_anchor(commit(1));  // a new plan starts with an anchor
  for (uint64_t v = 2; v <= 4; ++v) {
    trainer.Step();
    check_delta(commit(v));
  }
  trainer.Step();
  check_anchor(commit(5));  // anchor_every: 4

  // Version 6: the receiver applies half of its deltas, then its commit fails.
  trainer.Step();
  CHECK_THAT(failed_step(kFailVersion),
             Catch::Contains("agent inference-node: commit failed: delta mode on agent "
                             "inference-node: injected failure"));
  // The partial patch is never built upon: the next step is a dense anchor.
  trainer.Step();
  check_anchor(commit(7));
  trainer.Step();
  check_delta(commit(8));

  // The inference process scribbles on its own copy; the next delta lands on wrong bytes and
  // verification names the tensor; the anchor after it restores every byte.
  for (int i = 0; i < 64; ++i) inference.A()[1 + 2 * (i * 31337 % kElems)] ^= 0x40;
  trainer.Step();
  CHECK_THAT(failed_step(9), Catch::Contains("verification failed for version 9") &&
                                 Catch::Contains("a.weight (op") && !Catch::Contains("b.weight ("));
  // Version 9 again, with newer weights: an anchor. The failed attempt's slots carry the same
  // version but another nonce, so they are not applied over the fresh bytes.
  trainer.Step();
  check_anchor(commit(9));
  trainer.Step();
  check_delta(commit(10));

  // Delta off for the next plan (wbctl plan --create --delta off): dense steps, same bytes.
  auto off = ctl.Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(20), v1::DELTA_CHOICE_OFF);
  REQUIRE(off.ok());
  CHECK_FALSE(off->delta().enabled());
  trainer.Step();
  auto dense = commit(11);
  CHECK_FALSE(dense.delta_anchor());
  CHECK(dense.delta_ops() == 0);
  CHECK(dense.bytes() == kDense);
  // And on again: a new plan starts with an anchor, then deltas.
  auto on = ctl.Plan(wb::testing::World(1, 1, 1), std::chrono::seconds(20), v1::DELTA_CHOICE_ON);
  REQUIRE(on.ok());
  CHECK(on->delta().enabled());
  trainer.Step();
  check_anchor(commit(12));
  trainer.Step();
  check_delta(commit(13));
}

// The inference process shrinks (ftruncate) its shared-memory object after registering: the
// receiving agent's verification (a delta step that changed nothing: no slot writes, every
// destination hashed) and its delta apply then touch memory past the object's end. Each commit
// fails naming the tensor and the cause, the agent lives on, and once the object has its size
// back the next anchor restores every byte.
TEST_CASE("delta mode: a destination shrunk under the agent fails the commit, not the agent") {
  wb::testing::ClusterOptions opts;
  opts.extra_controller_yaml = "delta:\n  enabled: true\n  anchor_every: 100\n  verify: true\n";
  Cluster cluster(wb::testing::Runfile(""), opts);
  Trainer trainer = OpenTrainer(cluster.socket("trainer-node"));
  Inference inference = OpenInference(cluster.socket("inference-node"));
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  REQUIRE(wb::testing::PlanOneToOne(&ctl).delta().enabled());
  const uint64_t size = kElems * 3 + kScaleBytes;
  // The owner's own view of its object: resized through a second descriptor.
  auto resize = [&](uint64_t bytes) {
    const int fd = shm_open(inference.buffer.shm_name().c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    close(fd);
  };
  auto commit = [&](uint64_t v) {
    auto step = ctl.Step(v);
    INFO("version " << v << ": " << (step.ok() ? "" : std::string(step.status().message())));
    REQUIRE(step.ok());
    CHECK(NextEvent(inference).kind() == v1::Event::KIND_BEGIN);
    CHECK(NextEvent(inference).kind() == v1::Event::KIND_COMMIT);
    CheckBitForBit(trainer, inference, v);
    return *step;
  };
  auto shrunk_step = [&](uint64_t v) {
    auto step = ctl.Step(v);
    REQUIRE_FALSE(step.ok());
    CHECK(NextEvent(inference).kind() == v1::Event::KIND_BEGIN);
    CHECK(NextEvent(inference).kind() == v1::Event::KIND_ABORT);
    CHECK(cluster.agent("inference-node")->running());
    return std::string(step.status().message());
  };
  CHECK(commit(1).delta_anchor());
  trainer.Step();
  CHECK_FALSE(commit(2).delta_anchor());

  // Verification: nothing changed since version 2, so no delta writes; the hashes read.
  resize(0);
  CHECK_THAT(shrunk_step(3), Catch::Contains("agent inference-node: commit failed") &&
                                 Catch::Contains("verification: destination tensor") &&
                                 Catch::Contains("SIGBUS"));
  resize(size);
  trainer.Step();
  CHECK(commit(4).delta_anchor());

  // Apply: the deltas of a training step land past the end.
  resize(kElems);  // a.weight's first half only
  trainer.Step();
  CHECK_THAT(shrunk_step(5), Catch::Contains("agent inference-node: commit failed") &&
                                 Catch::Contains("destination tensor 'a.weight'") &&
                                 Catch::Contains("SIGBUS"));
  resize(size);
  trainer.Step();
  CHECK(commit(6).delta_anchor());
}

// One inference replica over two agents (tensor parallel: rank 0 holds a.weight's first rows on
// infer-a, rank 1 the rest on infer-b). infer-b's commit of version 3 fails after applying half
// of its deltas (the test hook): the replica is dropped whole, and infer-a's watcher, whose own
// commit succeeded, sees abort(3), never commit(3), so the two ranks never serve different
// versions. The next step (an anchor) commits on both.
TEST_CASE("a replica over two agents commits a version on both or on neither") {
  wb::testing::ClusterOptions opts;
  opts.agents = {"trainer-node", "infer-a", "infer-b"};
  opts.inference_ranks_per_replica = 2;
  opts.extra_controller_yaml = "delta:\n  enabled: true\n  anchor_every: 100\n";
  opts.agent_yaml["infer-b"] = "delta:\n  test_fail_commit_version: 3\n";
  Cluster cluster(wb::testing::Runfile(""), opts);
  Trainer trainer = OpenTrainer(cluster.socket("trainer-node"));
  constexpr int64_t kHalf = kRows / 2;
  struct Rank {
    SharedBuffer buffer;
    LocalSession session;
  };
  std::vector<Rank> ranks;
  constexpr uint64_t kShardBytes = kHalf * kCols * 2;
  for (int r = 0; r < 2; ++r) {
    auto buf = SharedBuffer::Create(2 * kShardBytes, "delta-tp");  // a.weight, then b.weight
    REQUIRE(buf.ok());
    auto s = LocalSession::Connect(cluster.socket(r == 0 ? "infer-a" : "infer-b"),
                                   Identity{v1::ROLE_INFERENCE, r, 0});
    REQUIRE(s.ok());
    int i = 0;
    for (const char* name : {"a.weight", "b.weight"}) {
      TensorInfo info{name, v1::DTYPE_BF16, {kRows, kCols}, {{r * kHalf, kHalf}, {0, kCols}}};
      auto reg = s->Register(info, *buf, i++ * kShardBytes, kShardBytes);
      INFO(reg.message());
      REQUIRE(reg.ok());
    }
    REQUIRE(s->Watch().ok());
    ranks.push_back(Rank{std::move(*buf), std::move(*s)});
  }
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  REQUIRE(wb::testing::PlanWorld(&ctl, wb::testing::World(1, 1, 2)).delta().enabled());
  auto events_of = [&](Rank& r) {
    std::vector<std::string> out;
    for (int i = 0; i < 2; ++i) {
      auto e = r.session.NextEvent(std::chrono::seconds(10));
      REQUIRE(e.ok());
      out.push_back(v1::Event::Kind_Name(e->kind()) + " " + std::to_string(e->version()));
    }
    return out;
  };
  auto holds = [&](Rank& r, int rank) {
    return std::memcmp(r.buffer.data(), trainer.A() + rank * kHalf * kCols, kShardBytes) == 0;
  };
  for (uint64_t v = 1; v <= 2; ++v) {
    if (v > 1) trainer.Step();
    auto step = ctl.Step(v);
    INFO((step.ok() ? "" : std::string(step.status().message())));
    REQUIRE(step.ok());
    for (int r = 0; r < 2; ++r) {
      CHECK(events_of(ranks[r]) == std::vector<std::string>{"KIND_BEGIN " + std::to_string(v),
                                                            "KIND_COMMIT " + std::to_string(v)});
      CHECK(holds(ranks[r], r));
    }
  }
  trainer.Step();
  auto failed = ctl.Step(3);
  REQUIRE_FALSE(failed.ok());
  CHECK_THAT(
      std::string(failed.status().message()),
      Catch::Contains("agent infer-b: commit failed") && Catch::Contains("injected failure"));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(events_of(ranks[r]) == std::vector<std::string>{"KIND_BEGIN 3", "KIND_ABORT 3"});
  }
  trainer.Step();
  auto healed = ctl.Step(4);
  INFO((healed.ok() ? "" : std::string(healed.status().message())));
  REQUIRE(healed.ok());
  CHECK(healed->delta_anchor());
  for (int r = 0; r < 2; ++r) {
    CHECK(events_of(ranks[r]) == std::vector<std::string>{"KIND_BEGIN 4", "KIND_COMMIT 4"});
    CHECK(holds(ranks[r], r));
  }
}
