// The capture store on its own: what one capture holds (spans merged per source region, relay
// ops left out), the budget's refusal and slots, the copy read back through the stand-ins after
// the live tensor changed, and the slot rules (never two captures into one slot, never a
// capture into a slot being sent from, no send without a capture of that version).
#include "daemon/executor/capture_store.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>

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

  // Not into a slot holding a capture not yet sent; not a send of another version.
  CHECK_FALSE(store.Capture(6, 0, &report).ok());
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
  CHECK(store.Capture(7, 0, &report).ok());  // sent: the slot takes the next capture

  // An abort discards its version's captures; a new plan discards them all.
  store.Discard(7);
  CHECK_FALSE(store.BeginSend(7, 0).ok());
  REQUIRE(store.Load(ops, 768, "plan 2").ok());
  auto gone = store.BeginSend(6, 1);
  REQUIRE_FALSE(gone.ok());
  CHECK_THAT(std::string(gone.status().message()), Catch::Contains("no capture of version 6"));
}
