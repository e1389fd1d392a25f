// libFuzzer target for the tcp transport's frame header parser (daemon/transport/tcp/frame.h).
// Asserts what the receiver relies on: an accepted header has a known type, obeys its per-type
// payload rules, re-encodes to the exact input bytes, and a refused one says why.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "daemon/transport/tcp/frame.h"

namespace {

using wb::transport::tcp::EncodeFrameHeader;
using wb::transport::tcp::FrameHeader;
using wb::transport::tcp::FrameType;
using wb::transport::tcp::FrameTypeName;
using wb::transport::tcp::kFrameHeaderBytes;
using wb::transport::tcp::kMaxControlPayload;
using wb::transport::tcp::ParseFrameHeader;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "frame_fuzz invariant violated: %s\n", what);
  __builtin_trap();
}

#define CHECK_INVARIANT(cond) \
  do {                        \
    if (!(cond)) Fail(#cond); \
  } while (0)

bool SameHeader(const FrameHeader& a, const FrameHeader& b) {
  return a.type == b.type && a.aux == b.aux && a.region_id == b.region_id && a.key == b.key &&
         a.offset == b.offset && a.length == b.length && a.batch_id == b.batch_id;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<FrameHeader> parsed = ParseFrameHeader(data, size);
  if (!parsed.ok()) {
    CHECK_INVARIANT(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_INVARIANT(!parsed.status().message().empty());
    return 0;
  }
  CHECK_INVARIANT(size >= kFrameHeaderBytes);
  const FrameHeader& header = *parsed;

  // A known type, and its per-type payload rules.
  CHECK_INVARIANT(std::strcmp(FrameTypeName(header.type), "UNKNOWN") != 0);
  switch (header.type) {
    case FrameType::kHello:
    case FrameType::kNack:
      CHECK_INVARIANT(header.length <= kMaxControlPayload);
      break;
    case FrameType::kWrite:
      CHECK_INVARIANT(header.length > 0);
      CHECK_INVARIANT(header.offset + header.length >= header.offset);  // no wrap-around
      break;
    case FrameType::kFlush:
      CHECK_INVARIANT(header.length == 0);
      CHECK_INVARIANT(header.aux > 0);
      break;
    case FrameType::kAck:
      CHECK_INVARIANT(header.length == 0);
      break;
    default:
      Fail("parsed a frame type outside the enum");
  }

  // Encoding is the exact inverse: same 56 bytes, and parsing those gives the same header.
  uint8_t encoded[kFrameHeaderBytes];
  EncodeFrameHeader(header, encoded);
  CHECK_INVARIANT(std::memcmp(encoded, data, kFrameHeaderBytes) == 0);
  absl::StatusOr<FrameHeader> reparsed = ParseFrameHeader(encoded, sizeof(encoded));
  CHECK_INVARIANT(reparsed.ok());
  CHECK_INVARIANT(SameHeader(*reparsed, header));

  // Only the first kFrameHeaderBytes bytes matter: a truncated copy is refused, never misread.
  absl::StatusOr<FrameHeader> truncated = ParseFrameHeader(data, kFrameHeaderBytes - 1);
  CHECK_INVARIANT(!truncated.ok());
  return 0;
}
