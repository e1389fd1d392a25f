// What the synthetic roles of wb-demo and wb-cluster share: an entry's size and shard geometry,
// its client registration info, one shared-memory buffer for all entries, the driver's stdin,
// and the bit-for-bit comparison (BF16 bytes, FP8 block quantization with its scales).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "common/planner/models.h"

namespace wb::demo {

// Elements of an entry's buffer, and its bytes.
uint64_t EntryElements(const planner::TensorEntry& e);
uint64_t EntryBytes(const planner::TensorEntry& e);

uint64_t Align64(uint64_t n);
uint64_t Total(const std::vector<int64_t>& shape);

// An entry's shard as a rectangle of its tensor viewed as 2-D (a 1-D tensor is one row).
struct Rect {
  int64_t r0, nr, c0, nc, cols;
};
Rect ShardRect(const planner::TensorEntry& e);

client::TensorInfo InfoOf(const planner::TensorEntry& e);

// One shared-memory buffer holding every entry (each 64-byte aligned).
struct Registered {
  client::SharedBuffer buffer;
  std::vector<uint64_t> offsets;  // per entry
};
absl::StatusOr<Registered> Allocate(const std::vector<planner::TensorEntry>& entries,
                                    const std::string& name);

// Whether the driver has closed our stdin (it only closes it, it sends nothing).
bool StdinClosed();

// "" when the bytes match, else "<name> at byte i: expected .., found ..".
std::string FirstMismatch(const std::string& name, const uint8_t* want, const uint8_t* got,
                          uint64_t bytes);

// Checks an FP8 block-scaled destination (rows x cols) against its expected BF16 values: its
// bytes at `got` and, when `scale` is registered (non-null), its scales at `scale_got`. Returns
// the first mismatch ("" when none) and adds the bytes checked to *checked.
std::string CheckFp8(const planner::TensorEntry& e, const std::vector<uint16_t>& want,
                     uint64_t rows, uint64_t cols, const uint8_t* got,
                     const planner::TensorEntry* scale, const uint8_t* scale_got,
                     uint64_t* checked);

}  // namespace wb::demo
