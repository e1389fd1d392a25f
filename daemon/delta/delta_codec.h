// Sparse deltas between two versions of a weight buffer (delta mode): between RL steps ~99% of
// BF16 elements are bit-identical, so the sender ships only (index, value) records of the
// changed elements and the receiver patches its copy in place.
//
// Packed format, little-endian, self-describing:
//   offset 0  u32 magic "WBD1"      offset 4  u8 version (1)
//   offset 5  u8 element size (1, 2 or 4 bytes)
//   offset 6  u8 index width (1, 2, 4 or 8 bytes: the narrowest that holds every gap)
//   offset 7  u8 reserved (0)       offset 8  u64 total elements of the buffer
//   offset 16 u64 record count      offset 24 count gaps, then count values
// Gap i is index[i] - index[i-1] (gap 0 is index[0]); indices strictly increase. Width 8 only
// appears for gaps of 2^32 elements or more.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace wb::delta {

constexpr uint32_t kDeltaMagic = 0x31444257;  // "WBD1"
constexpr uint8_t kDeltaVersion = 1;
constexpr size_t kDeltaHeaderBytes = 24;

struct DeltaHeader {
  int elem_size = 0;
  int index_width = 0;
  uint64_t total_elems = 0;
  uint64_t count = 0;
};

struct DeltaEncoding {
  // kDense: the packed form would not be smaller than the buffer itself; send it whole.
  enum class Kind { kPacked, kDense };
  Kind kind = Kind::kPacked;
  std::vector<uint8_t> packed;  // kPacked only
  // Changed elements; for kDense a lower bound (the scan stops once dense is certain).
  uint64_t changed_elems = 0;
};

// Compares `shadow` (the previous version) with `next` element by element (elem_size 1, 2 or
// 4), encodes the changed elements and updates `shadow` to equal `next` in both outcomes.
// Buffers of several 8 MiB split across up to `threads` threads (0: hardware concurrency);
// the result does not depend on the thread count.
absl::StatusOr<DeltaEncoding> EncodeDelta(absl::Span<uint8_t> shadow,
                                          absl::Span<const uint8_t> next, int elem_size,
                                          int threads = 0);

// Reads and checks the header, including that the record section has the size it announces.
absl::StatusOr<DeltaHeader> ParseDeltaHeader(absl::Span<const uint8_t> packed);

// Writes the records of `packed` into `dst` (the receiver's copy of the previous version).
// Every index is checked before the first write: on error `dst` is untouched.
absl::Status ApplyDelta(absl::Span<const uint8_t> packed, absl::Span<uint8_t> dst);

}  // namespace wb::delta
