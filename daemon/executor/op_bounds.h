// Bounds of a plan operation against the sending agent's own memory, checked before any byte
// is read: a plan comes from the network, and every size in it is a number someone chose.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::executor {

// OK when every byte `op` reads lies inside a source region of `source_length` bytes and every
// size derived from it (row bytes, staging bytes, write lengths) fits in 62 bits. All arithmetic
// is checked; errors say which number is out of range (the caller adds the op's name).
absl::Status CheckSourceOp(const weightbeam::v1::TransferOp& op, uint64_t source_length);

// The bytes `op` reads from src_offset on: (rows - 1) * stride + one row, where a stride of 0
// means rows are packed. Only for an op CheckSourceOp accepted (nothing here can overflow).
uint64_t SourceSpan(const weightbeam::v1::TransferOp& op);

}  // namespace wb::executor
