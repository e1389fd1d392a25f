// The capture store on its own: what one capture holds (spans merged per source region, relay
// ops left out), the budget's refusal and slots, the copy read back through the stand-ins after
// the live tensor changed, and the slot rules (never two captures into one slot, never a
// capture into a slot being sent from, no send without a capture of that version).
#include "daemon/executor/capture_store.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "config/config.h"
#include "daemon/registry/region_registry.h"
#include "daemon/transport/factory.h"

namespace v1 = weightbeam::v1;
using namespace wb;

namespace {

class HeapHold : public registry::MemoryHold {
 public:
  explicit HeapHold(size_t n) : bytes(n) {}
  std::vector<uint8_t> bytes;
};

struct Fixture {
  std::shared_ptr<HeapHold> memory = std::make_shared<HeapHold>(4096);
  std::unique_ptr<transport::Transport> local;
  std::unique_ptr<registry::RegionRegistry> registry;
  uint64_t region = 0;

  Fixture() {
    config::AgentConfig cfg;
    auto t = transport::MakeTransport("local", cfg);
    REQUIRE(t.ok());
    local = std::move(*t);
    registry = std::make_unique<registry::RegionRegistry>(
        std::vector<transport::Transport*>{local.get()},
        [this](const v1::MemoryHandle&,
               const registry::Caller&) -> absl::StatusOr<registry::OpenedMemory> {
          registry::OpenedMemory m;
          m.ref = {memory->bytes.data(), memory->bytes.size(), transport::MemoryKind::kHost, -1};
          m.location = "host";
          m.hold = memory;
          return m;
        });
    v1::TensorRegistration r;
    r.mutable_spec()->set_name("w");
    r.mutable_spec()->set_dtype(v1::DTYPE_BF16);
    r.mutable_spec()->add_global_shape(32);
    r.mutable_spec()->add_global_shape(64);
    r.mutable_memory()->mutable_host_shm()->set_shm_name("/w");
    r.mutable_memory()->mutable_host_shm()->set_length(4096);
    v1::Owner owner;
    owner.set_role(v1::ROLE_TRAINER);
    auto l = registry->Register(1, owner, r);
    REQUIRE(l.ok());
    region = l->region().region_id();
    std::iota(memory->bytes.begin(), memory->bytes.end(), 0);
  }
};

// `rows` rows of 64 BF16 elements from byte `offset`, `stride` bytes apart (0: packed).
v1::TransferOp Op(uint64_t region, uint64_t offset, uint64_t rows, uint64_t stride = 0) {
  v1::TransferOp op;
  op.set_src_region(region);
  op.set_src_offset(offset);
  op.set_rows(rows);
  op.set_row_elems(64);
  op.set_src_stride(stride);
  op.set_src_dtype(v1::DTYPE_BF16);
  op.set_dst_dtype(v1::DTYPE_BF16);
  op.set_transform(v1::TRANSFORM_COPY);
  return op;
}

}  // namespace

TEST_CASE("capture layout: spans merged per region, relay ops not captured") {
  google::protobuf::RepeatedPtrField<v1::TransferOp> ops;
  *ops.Add() = Op(7, 0, 2);          // [0, 256)
  *ops.Add() = Op(7, 256, 1);        // [256, 384): touches the first
  *ops.Add() = Op(7, 1024, 2, 512);  // [1024, 1664)
  *ops.Add() = Op(7, 1100, 1);       // inside the last
  *ops.Add() = Op(9, 128, 1);        // another region
  v1::TransferOp relay = Op(11, 0, 8);
  relay.set_relay(true);
  *ops.Add() = relay;
  auto layout = executor::CaptureLayout::ForOps(ops);
  REQUIRE(layout.ok());
  CHECK(layout->bytes == 384 + 640 + 128);
  REQUIRE(layout->regions.at(7).size() == 2);
  CHECK(layout->regions.at(7)[0].offset == 0);
  CHECK(layout->regions.at(7)[0].length == 384);
  CHECK(layout->regions.at(7)[1].offset == 1024);
  CHECK(layout->regions.at(7)[1].length == 640);
  CHECK(layout->regions.count(11) == 0);
}

TEST_CASE("capture store: budget, copy, and the slot rules") {
  Fixture f;
  google::protobuf::RepeatedPtrField<v1::TransferOp> ops;
  *ops.Add() = Op(f.region, 128, 2);   // [128, 384)
  *ops.Add() = Op(f.region, 2048, 1);  // [2048, 2176)
  executor::CaptureStore store(f.registry.get());

  auto refused = store.Load(ops, 383, "plan 1 on agent t");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("needs 384 bytes") && Catch::Contains("capture.max_bytes = 383"));
  CHECK(store.slots() == 0);
  auto off = store.Load(ops, 0, "plan 1");
  REQUIRE(off.ok());
  CHECK(*off == 384);
  CHECK(store.slots() == 0);
  REQUIRE(store.Load(ops, 767, "plan 1").ok());
  CHECK(store.slots() == 1);
  REQUIRE(store.Load(ops, 768, "plan 1").ok());
  CHECK(store.slots() == 2);

  v1::AgentStepReport report;
  REQUIRE(store.Capture(5, 0, &report).ok());
  CHECK(report.capture_bytes() == 384);
  const std::vector<uint8_t> before = f.memory->bytes;
  std::memset(f.memory->bytes.data(), 0xEE, f.memory->bytes.size());  // the trainer goes on

  // Not a send of another version.
  CHECK_FALSE(store.BeginSend(6, 0).ok());
  CHECK_FALSE(store.BeginSend(5, 1).ok());
  CHECK_FALSE(store.Capture(6, 2, &report).ok());  // no such slot

  auto sources = store.BeginSend(5, 0);
  REQUIRE(sources.ok());
  for (const auto& op : ops) {
    auto t = (*sources)->For(op);
    REQUIRE(t);
    const auto* p = static_cast<const uint8_t*>(t->memory.addr) + op.src_offset();
    CHECK(std::memcmp(p, before.data() + op.src_offset(), op.rows() * 128) == 0);
  }
  v1::TransferOp relay = ops[0];
  relay.set_relay(true);
  CHECK((*sources)->For(relay) == nullptr);  // relay ops read in place

  // Never into the slot being sent from; the other slot is free.
  CHECK_FALSE(store.Capture(6, 0, &report).ok());
  CHECK(store.Capture(6, 1, &report).ok());
  store.EndSend(0);
  CHECK(store.BeginSend(5, 0).ok());  // a retried send of the same capture
  store.EndSend(0);
  sources->reset();                          // the send's stand-ins go with it
  CHECK(store.Capture(7, 0, &report).ok());  // sent: the slot takes the next capture

  // An abort discards its version's captures; a new plan discards them all.
  store.Discard(7);
  CHECK_FALSE(store.BeginSend(7, 0).ok());
  REQUIRE(store.Load(ops, 768, "plan 2").ok());
  auto gone = store.BeginSend(6, 1);
  REQUIRE_FALSE(gone.ok());
  CHECK_THAT(std::string(gone.status().message()), Catch::Contains("no capture of version 6"));
}

namespace {

google::protobuf::RepeatedPtrField<v1::TransferOp> TwoOps(uint64_t region) {
  google::protobuf::RepeatedPtrField<v1::TransferOp> ops;
  *ops.Add() = Op(region, 128, 2);   // [128, 384)
  *ops.Add() = Op(region, 2048, 1);  // [2048, 2176): 384 bytes in all
  return ops;
}

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

// Issue 41, item 5: before, Discard skipped a capture in progress, which then finished as a
// capture never sent, and the slot refused every later capture until a new plan.
TEST_CASE("capture store: a capture still running when its step is aborted ends discarded") {
  Fixture f;
  executor::CaptureStore store(f.registry.get(), 2, milliseconds(400));
  REQUIRE(store.Load(TwoOps(f.region), 768, "plan 1").ok());
  absl::Status captured;
  const auto t0 = Clock::now();
  std::thread capture([&] {
    v1::AgentStepReport report;
    captured = store.Capture(5, 0, &report, /*step_id=*/77);
  });
  std::this_thread::sleep_for(milliseconds(50));
  store.Discard(5, 77);
  capture.join();
  CHECK(Clock::now() - t0 < milliseconds(300));  // it stopped, not ran to its end
  CHECK(captured.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(captured.message()), Catch::Contains("aborted during the capture"));
  CHECK_FALSE(store.BeginSend(5, 0).ok());
  v1::AgentStepReport report;
  CHECK(store.Capture(6, 0, &report, 78).ok());  // the slot takes the next step at once
  CHECK(store.BeginSend(6, 0).ok());
}

TEST_CASE("capture store: a discard names its step; a late abort of another step is ignored") {
  Fixture f;
  executor::CaptureStore store(f.registry.get());
  REQUIRE(store.Load(TwoOps(f.region), 768, "plan 1").ok());
  v1::AgentStepReport report;
  REQUIRE(store.Capture(5, 0, &report, /*step_id=*/11).ok());
  store.Discard(5, 10);  // the abort of version 5's earlier, failed step, arriving late
  CHECK(store.BeginSend(5, 0).ok());
  store.EndSend(0);
  store.Discard(5, 11);
  CHECK_FALSE(store.BeginSend(5, 0).ok());
  // By version when the capture named no step.
  REQUIRE(store.Capture(6, 1, &report).ok());
  store.Discard(6, 12);
  CHECK_FALSE(store.BeginSend(6, 1).ok());
}

TEST_CASE("capture store: a capture stops at its deadline and leaves its slot empty") {
  Fixture f;
  executor::CaptureStore store(f.registry.get(), 2, milliseconds(300));
  REQUIRE(store.Load(TwoOps(f.region), 768, "plan 1").ok());
  v1::AgentStepReport report;
  const auto t0 = Clock::now();
  const absl::Status late = store.Capture(5, 0, &report, 1, t0 + milliseconds(30));
  CHECK(Clock::now() - t0 < milliseconds(250));
  CHECK(late.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(late.message()), Catch::Contains("before its deadline"));
  CHECK(store.Capture(6, 0, &report, 2).ok());
}

TEST_CASE("capture store: an unsent capture in a slot the controller gives out again is replaced") {
  // Its step failed and the abort was lost (best effort), or the controller restarted: the
  // controller hands slots out, so the slot is free by its account.
  Fixture f;
  executor::CaptureStore store(f.registry.get());
  REQUIRE(store.Load(TwoOps(f.region), 768, "plan 1").ok());
  v1::AgentStepReport report;
  REQUIRE(store.Capture(5, 0, &report, 1).ok());
  REQUIRE(store.Capture(6, 0, &report, 2).ok());
  CHECK_FALSE(store.BeginSend(5, 0).ok());
  REQUIRE(store.BeginSend(6, 0).ok());
  // Never into a slot being sent from.
  CHECK_FALSE(store.Capture(7, 0, &report, 3).ok());
}

// Issue 41, item 11: before, a plan load took the new slots' memory while a send still held
// the old plan's, and freed and paged in every buffer again under the store's lock.
TEST_CASE("capture store: capture memory stays within the budget across a plan load") {
  Fixture f;
  executor::CaptureStore store(f.registry.get());
  REQUIRE(store.Load(TwoOps(f.region), 768, "plan 1").ok());
  CHECK(store.memory_bytes() == 768);  // two slots of 384, taken at load
  REQUIRE(store.Load(TwoOps(f.region), 768, "plan 2").ok());
  CHECK(store.memory_bytes() == 768);  // the same sizes: kept, not taken twice
  v1::AgentStepReport report;
  REQUIRE(store.Capture(5, 0, &report, 1).ok());
  auto sending = store.BeginSend(5, 0);
  REQUIRE(sending.ok());
  // A plan whose one capture is 640 bytes loads while version 5's send still reads slot 0.
  google::protobuf::RepeatedPtrField<v1::TransferOp> bigger;
  *bigger.Add() = Op(f.region, 0, 5);
  REQUIRE(store.Load(bigger, 768, "plan 3").ok());
  CHECK(store.slots() == 1);
  CHECK(store.memory_bytes() <= 768);
  // While the send holds its memory, a capture that needs more is refused, naming the budget.
  auto refused = store.Capture(6, 0, &report, 2, Clock::now() + milliseconds(100));
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.message()), Catch::Contains("capture.max_bytes = 768"));
  CHECK(store.memory_bytes() <= 768);
  sending->reset();  // the send is over
  REQUIRE(store.Capture(7, 0, &report, 3).ok());
  CHECK(store.memory_bytes() == 640);
}
