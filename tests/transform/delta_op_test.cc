// Delta mode over the network, without the network: an op's transformed bytes go through the
// sender's shadow compare into a receive slot and are scattered into strided destination
// memory (BF16 rows with a row stride, ragged FP8 blocks with their scales). Every case checks
// the destination against a dense write of the same bytes, bytes outside the op untouched, and
// that the sender's hash equals the receiver's; every packed delta is also applied through
// ResolveDelta + ScatterHost (the checks and lists the GPU path uses) and must give the same
// bytes as ApplyToDestination.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "daemon/delta/delta_codec.h"
#include "daemon/delta/delta_sender.h"
#include "daemon/delta/op_layout.h"
#include "tests/transform/transfer_ops.h"

namespace wb::delta {
namespace {

namespace v1 = weightbeam::v1;

constexpr uint8_t kSentinel = 0xA5;

// A BF16 copy of `rows` x `cols` landing with a row stride of cols + 8 elements at offset 64.
v1::TransferOp StridedBf16(uint64_t rows, uint64_t cols) {
  return wb::testing::StridedCopy(v1::DTYPE_BF16, rows, cols, 8, 64);
}

// BF16 -> FP8 with ragged 128x128 blocks (rows, cols not multiples of 128), data rows packed.
v1::TransferOp RaggedFp8(uint64_t rows, uint64_t cols) {
  return wb::testing::RaggedFp8(rows, cols, 0, 0);
}

struct Destination {
  std::vector<uint8_t> data, scales;
  explicit Destination(size_t n) : data(n, kSentinel), scales(n, kSentinel) {}
  bool operator==(const Destination& o) const { return data == o.data && scales == o.scales; }
};

// A dense write: every segment of the flat bytes at its destination.
void DenseWrite(const OpLayout& l, const std::vector<uint8_t>& flat, Destination* d) {
  for (const Segment& s : l.segments) {
    auto& region = s.scales ? d->scales : d->data;
    std::memcpy(region.data() + s.dst_offset, flat.data() + s.flat_offset, s.length);
  }
}

struct Harness {
  v1::TransferOp op;
  OpLayout layout;
  DeltaSender sender;
  Destination receiver;  // what the receiving agent holds
  uint64_t version = 0;

  static v1::AgentPlan PlanOf(const v1::TransferOp& op) {
    v1::AgentPlan p;
    *p.add_ops() = op;
    v1::DeltaSlot* slot = p.add_delta_slots();
    slot->set_op_id(op.op_id());
    slot->set_region_id(99);
    slot->set_offset(4096);
    slot->set_capacity(kSlotHeaderBytes + LayoutOf(op).dense_bytes / 2);
    return p;
  }
  explicit Harness(const v1::TransferOp& o)
      : op(o), layout(LayoutOf(o)), sender(PlanOf(o)), receiver(1 << 20) {}

  // One step: the sender processes `flat`; a packed outcome is applied through the slot bytes,
  // a dense one written whole. Returns the outcome.
  OpOutcome Step(std::vector<uint8_t> flat, bool anchor) {
    ++version;
    std::vector<uint8_t> expected_flat = flat;
    StepDelta step{true, anchor, true, version, 1000 + version};
    auto out = sender.Process(op, flat.data(), step);
    REQUIRE(out.ok());
    Destination expected = receiver;
    DenseWrite(layout, expected_flat, &expected);
    if (out->packed) {
      SlotHeader h = ReadSlotHeader(flat.data());
      CHECK(h.magic == kSlotMagic);
      CHECK(h.version == version);
      CHECK(h.op_id == op.op_id());
      CHECK(kSlotHeaderBytes + h.payload_bytes == out->write_bytes);
      CHECK(out->slot_region == 99);
      CHECK(out->slot_offset == 4096);
      const auto packed = absl::MakeConstSpan(flat.data() + kSlotHeaderBytes, h.payload_bytes);
      Destination resolved = receiver;
      auto list = ResolveDelta(packed, layout);
      REQUIRE(list.ok());
      CHECK(list->data_offsets.size() + list->scale_offsets.size() == out->changed_elems);
      ScatterHost(*list, resolved.data.data(), resolved.scales.data());
      auto s = ApplyToDestination(packed, layout, receiver.data.data(), receiver.scales.data());
      REQUIRE(s.ok());
      CHECK(resolved == receiver);
    } else {
      DenseWrite(layout, expected_flat, &receiver);
    }
    CHECK(receiver == expected);
    CHECK(out->hash == HashDestination(layout, receiver.data.data(), receiver.scales.data()));
    return *out;
  }
};

}  // namespace

TEST_CASE("layouts: strided rows, ragged FP8 blocks with padded, strided scales", "[delta]") {
  OpLayout b = LayoutOf(StridedBf16(3, 5));
  REQUIRE(b.segments.size() == 3);
  CHECK(b.elem_size == 2);
  CHECK(b.flat_bytes == 30);
  CHECK(b.segments[2].dst_offset == 64 + 2 * 26);
  OpLayout f = LayoutOf(RaggedFp8(130, 200));  // 2 x 2 blocks, data 26000 bytes
  CHECK(f.elem_size == 1);
  CHECK(f.dense_bytes == 26000 + 2 * 2 * 4);
  CHECK(f.flat_bytes == 26000 + 2 * 8);    // 26000 is 16-aligned: no padding
  OpLayout g = LayoutOf(RaggedFp8(3, 5));  // 15 data bytes, scales after 1 byte of padding
  CHECK(g.segments.back().flat_offset == 16);
  CHECK(g.flat_bytes == 20);
}

TEST_CASE("strided BF16: no change, one change at each end, all changed", "[delta]") {
  Harness h(StridedBf16(64, 100));
  std::vector<uint8_t> v = wb::testing::RandomBytes(h.layout.flat_bytes, 1);
  CHECK_FALSE(h.Step(v, /*anchor=*/true).packed);  // anchor: dense, shadow filled

  OpOutcome same = h.Step(v, false);  // no change: a bare header
  CHECK(same.packed);
  CHECK(same.changed_elems == 0);

  v[0] ^= 1;                // first element
  v[v.size() - 1] ^= 0x80;  // last element
  OpOutcome ends = h.Step(v, false);
  CHECK(ends.packed);
  CHECK(ends.changed_elems == 2);

  OpOutcome all =
      h.Step(wb::testing::RandomBytes(v.size(), 2), false);  // all changed: dense is smaller
  CHECK_FALSE(all.packed);
  v = wb::testing::RandomBytes(v.size(), 2);
  v[v.size() / 2] ^= 4;
  CHECK(h.Step(v, false).packed);  // the shadow followed the dense step
}

TEST_CASE("ragged FP8: changed data and scale bytes; padding never counts", "[delta]") {
  Harness h(RaggedFp8(131, 201));
  std::vector<uint8_t> v = wb::testing::RandomBytes(h.layout.flat_bytes, 3);
  CHECK_FALSE(h.Step(v, true).packed);
  const Segment& last_scale = h.layout.segments.back();
  v[last_scale.flat_offset + last_scale.length - 1] ^= 0xff;  // last scale's top byte
  v[131 * 201 - 1] ^= 0x11;                                   // last FP8 byte
  // Padding between data and scales holds garbage in a reused staging buffer.
  for (uint64_t i = 131 * 201; i < h.layout.segments[1].flat_offset; ++i) v[i] = 0x5a;
  OpOutcome out = h.Step(v, false);
  CHECK(out.packed);
  CHECK(out.changed_elems == 2);
}

TEST_CASE("a step after invalidation or with a too-small slot goes dense", "[delta]") {
  Harness h(StridedBf16(32, 64));
  std::vector<uint8_t> v = wb::testing::RandomBytes(h.layout.flat_bytes, 4);
  h.Step(v, true);
  // 40% of the elements changed: packed would be smaller than dense but not fit the slot
  // (half of the dense bytes).
  std::mt19937 rng(5);
  for (size_t i = 0; i < v.size(); i += 2) {
    if (rng() % 10 < 4) v[i] ^= 1;
  }
  CHECK_FALSE(h.Step(v, false).packed);
  v[10] ^= 1;
  CHECK(h.Step(v, false).packed);
}

TEST_CASE("a damaged delta is refused before any byte is written", "[delta]") {
  Harness h(StridedBf16(8, 16));  // 128 elements
  std::vector<uint8_t> v = wb::testing::RandomBytes(h.layout.flat_bytes, 6);
  h.Step(v, true);
  v[5] ^= 1;
  std::vector<uint8_t> flat = v;
  auto out = h.sender.Process(h.op, flat.data(), StepDelta{true, false, false, 9, 9});
  REQUIRE(out.ok());
  REQUIRE(out->packed);
  SlotHeader hd = ReadSlotHeader(flat.data());
  std::vector<uint8_t> packed(flat.begin() + kSlotHeaderBytes,
                              flat.begin() + kSlotHeaderBytes + hd.payload_bytes);
  // The one gap (1 byte wide) now points past the last element.
  REQUIRE(packed[6] == 1);
  packed[24] = 0xff;
  Destination before = h.receiver;
  auto s = ApplyToDestination(packed, h.layout, h.receiver.data.data(), h.receiver.scales.data());
  CHECK_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("points past element 128"));
  CHECK(h.receiver == before);
  auto list = ResolveDelta(packed, h.layout);  // the GPU path refuses it the same way
  REQUIRE_FALSE(list.ok());
  CHECK(list.status() == s);
  // A delta of another op's size is refused too.
  OpLayout other = LayoutOf(StridedBf16(8, 8));
  s = ApplyToDestination(absl::MakeConstSpan(flat.data() + kSlotHeaderBytes, hd.payload_bytes),
                         other, h.receiver.data.data(), h.receiver.scales.data());
  CHECK_FALSE(s.ok());
  CHECK(h.receiver == before);
  CHECK(ResolveDelta(absl::MakeConstSpan(flat.data() + kSlotHeaderBytes, hd.payload_bytes), other)
            .status() == s);
}

TEST_CASE("resolved records: destination offsets of strided rows and strided scales", "[delta]") {
  // FP8 3 x 60: 180 data bytes at flat 0..179, padding to 192, one 4-byte scale at flat 192.
  v1::TransferOp op = RaggedFp8(3, 60);
  op.set_dst_offset(100);
  op.set_dst_stride(64);
  const OpLayout layout = LayoutOf(op);
  REQUIRE(layout.flat_bytes == 196);
  std::vector<uint8_t> shadow(layout.flat_bytes, 0), next(layout.flat_bytes, 0);
  next[0] = 1;    // row 0, col 0 -> 100
  next[62] = 2;   // row 1, col 2 -> 100 + 64 + 2
  next[179] = 3;  // row 2, col 59 -> 100 + 128 + 59
  next[185] = 9;  // padding: never lands
  next[195] = 4;  // scale byte 3 -> scale_offset 16 + 3
  auto enc = EncodeDelta(absl::MakeSpan(shadow), next, 1);
  REQUIRE(enc.ok());
  REQUIRE(enc->kind == DeltaEncoding::Kind::kPacked);
  auto list = ResolveDelta(enc->packed, layout);
  REQUIRE(list.ok());
  CHECK(list->elem_size == 1);
  CHECK(list->data_offsets == std::vector<uint64_t>{100, 166, 287});
  CHECK(list->data_values == std::vector<uint8_t>{1, 2, 3});
  CHECK(list->scale_offsets == std::vector<uint64_t>{19});
  CHECK(list->scale_values == std::vector<uint8_t>{4});
}

}  // namespace wb::delta
