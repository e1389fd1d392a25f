// The tcp transport's wire frame: a fixed 64-byte little-endian header, optionally followed by
// `length` payload bytes. ParseFrameHeader is a pure function (no I/O, no allocation) so it can
// be fuzzed; the receiver validates region, key and bounds against its RegionTable afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace wb::transport::tcp {

inline constexpr uint32_t kFrameMagic = 0x46544257;  // "WBTF" read as little-endian
// Version 2 added the step id (8 bytes at the end): version 1 peers are refused at HELLO.
// Version 3: a region may be a buffer registered once, its tensors at offsets inside it
// (RemoteKey.base); a version-2 sender would write tensor-relative offsets into another tensor.
inline constexpr uint8_t kFrameVersion = 3;
inline constexpr size_t kFrameHeaderBytes = 64;
// Upper bound of the payload of control frames (HELLO, NACK).
inline constexpr uint64_t kMaxControlPayload = 4096;

enum class FrameType : uint8_t {
  // Initiator -> acceptor, first frame of a connection; payload: a serialized TcpHello.
  kHello = 1,
  // Payload `length` bytes for region `region_id` (with `key`) at `offset`, part of `batch_id`
  // of step `step`: the receiver refuses it (NACK) unless `step` is the step it began.
  kWrite = 2,
  // End of this connection's share of `batch_id`: `aux` = connections carrying the batch,
  // `offset` = bytes this connection wrote for it. Answered by kAck.
  kFlush = 3,
  // Acceptor -> initiator: HELLO accepted (batch_id 0) or every write of `batch_id` landed.
  kAck = 4,
  // Acceptor -> initiator: a write of `batch_id` was refused; payload: the reason (text).
  kNack = 5,
};

struct FrameHeader {
  FrameType type = FrameType::kWrite;
  uint32_t aux = 0;
  uint64_t region_id = 0;
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t batch_id = 0;
  uint64_t step = 0;  // WRITE: the step the write belongs to; 0 in other frames
};

// Checks magic, version, type, reserved fields, and per-type payload rules (control frames
// carry at most kMaxControlPayload bytes; offset + length must not overflow). Does not know
// the receiver's frame limit or regions.
absl::StatusOr<FrameHeader> ParseFrameHeader(const uint8_t* data, size_t size);

// Writes exactly kFrameHeaderBytes bytes to `out`.
void EncodeFrameHeader(const FrameHeader& header, uint8_t* out);

const char* FrameTypeName(FrameType type);

}  // namespace wb::transport::tcp
