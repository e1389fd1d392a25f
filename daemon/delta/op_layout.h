// Delta mode over the network: how one plan operation's transformed bytes (its "flat" staging
// layout: dense rows, then FP8 block scales) map onto its destination regions, the header of a
// receive slot, a destination hash for verification, and applying a packed delta into strided
// destination memory (straight, or resolved to offsets + values for a GPU scatter). Shared by
// the sending and the receiving agent.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::delta {

// A contiguous piece of the flat layout and where it lands in the destination (data) region or,
// for FP8 block scales, in the scale region. Segments are in flat order and do not overlap.
struct Segment {
  uint64_t flat_offset = 0;
  uint64_t length = 0;
  uint64_t dst_offset = 0;  // byte offset in its destination region
  bool scales = false;
};

struct OpLayout {
  uint64_t flat_bytes = 0;   // staging bytes (padding between data and scales included)
  uint64_t dense_bytes = 0;  // bytes a dense write lands (sum of segment lengths)
  int elem_size = 1;         // the codec's element size for this op (1, 2 or 4)
  std::vector<Segment> segments;
};

// The layout of `op`'s transformed output. Rows are dense in the flat layout; FP8 scales start
// at the data size rounded up to 16 bytes (as executor::Fp8ScaleOffset).
OpLayout LayoutOf(const weightbeam::v1::TransferOp& op);

// Receive slot: header, then the packed delta. The receiver applies a slot only when version
// and nonce match the commit, so a slot from an earlier or aborted attempt is never re-applied.
constexpr uint64_t kSlotMagic = 0x544f4c5344425757ull;  // "WWBDSLOT"
constexpr size_t kSlotHeaderBytes = 40;
struct SlotHeader {
  uint64_t magic = kSlotMagic;
  uint64_t version = 0;
  uint64_t nonce = 0;
  uint64_t op_id = 0;
  uint64_t payload_bytes = 0;
};
void WriteSlotHeader(const SlotHeader& h, uint8_t* at);
SlotHeader ReadSlotHeader(const uint8_t* at);

// Streaming 64-bit hash (multiply-xor over 8-byte words); not cryptographic.
uint64_t HashBytes(const uint8_t* p, size_t n, uint64_t seed);
// Hash of the bytes the op lands, from its flat layout (sender) ...
uint64_t HashFlat(const OpLayout& layout, const uint8_t* flat);
// ... and from the destination memory (receiver); equal when every landed byte is equal.
uint64_t HashDestination(const OpLayout& layout, const uint8_t* dst_region,
                         const uint8_t* scale_region);

// Writes the records of `packed` (a delta of the op's flat layout) into the destination
// regions. Every index is checked first (in range, increasing, element size and length as the
// layout says): on error nothing is written. Records that fall into padding are skipped.
absl::Status ApplyToDestination(absl::Span<const uint8_t> packed, const OpLayout& layout,
                                uint8_t* dst_region, uint8_t* scale_region);

// A packed delta resolved against its op's layout: for the data region and for the scale
// region, the destination byte offset of every record and its value (elem_size bytes each, in
// record order). Records that fall into padding are dropped. What a GPU scatter copies to the
// device; ScatterHost(ResolveDelta(...)) writes the same bytes as ApplyToDestination.
struct ScatterList {
  int elem_size = 1;
  std::vector<uint64_t> data_offsets;
  std::vector<uint8_t> data_values;
  std::vector<uint64_t> scale_offsets;
  std::vector<uint8_t> scale_values;
};

// Checks `packed` exactly as ApplyToDestination does (same errors) and resolves its records.
absl::StatusOr<ScatterList> ResolveDelta(absl::Span<const uint8_t> packed, const OpLayout& layout);

// Writes a resolved list into host memory (`scale_region` may be null when it has no scales).
void ScatterHost(const ScatterList& list, uint8_t* dst_region, uint8_t* scale_region);

}  // namespace wb::delta
