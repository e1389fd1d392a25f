// libFuzzer target for the tcp transport's frame header parser (daemon/transport/tcp/frame.h).
// Asserts what the receiver relies on: an accepted header has a known type, obeys its per-type
// payload rules, re-encodes to the exact input bytes, and a refused one says why. WRITE frames
// then take the receiver's checks (max_frame_bytes, RegionTable::PinRemoteWrite) and an
// accepted one has its payload written, so ASan sees any byte landing outside the region.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/transport/region_table.h"
#include "daemon/transport/tcp/frame.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using wb::transport::tcp::EncodeFrameHeader;
using wb::transport::tcp::FrameHeader;
using wb::transport::tcp::FrameType;
using wb::transport::tcp::FrameTypeName;
using wb::transport::tcp::kFrameHeaderBytes;
using wb::transport::tcp::kMaxControlPayload;
using wb::transport::tcp::ParseFrameHeader;

// The receiver's frame limit in this harness (TcpReceiver::HandleWrite checks it first).
constexpr uint64_t kMaxFrameBytes = 1 << 20;

constexpr char kTarget[] = "frame_fuzz";

bool SameHeader(const FrameHeader& a, const FrameHeader& b) {
  return a.type == b.type && a.aux == b.aux && a.region_id == b.region_id && a.key == b.key &&
         a.offset == b.offset && a.length == b.length && a.batch_id == b.batch_id &&
         a.step == b.step;
}

// What the receiver writes into: a destination region sized exactly to its heap buffer (so any
// overrun is an ASan report), a second destination of 1 byte, and a source region.
struct Regions {
  wb::transport::RegionTable table{"tcp"};
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<wb::transport::RegionInfo> infos;

  Regions() {
    Add(4096, wb::transport::Access::kDestination);
    Add(1, wb::transport::Access::kDestination);
    Add(64, wb::transport::Access::kSource);
  }
  void Add(uint64_t length, wb::transport::Access access) {
    buffers.push_back(std::make_unique<uint8_t[]>(length));
    wb::transport::MemoryRef mem;
    mem.addr = buffers.back().get();
    mem.length = length;
    auto info = table.Add(mem, access);
    if (!info.ok()) wb::fuzz::Fail(kTarget, "RegionTable::Add refused a harness region");
    infos.push_back(*info);
  }
  const wb::transport::RegionInfo* Find(uint64_t id) const {
    for (const auto& info : infos) {
      if (info.id == id) return &info;
    }
    return nullptr;
  }
};

// HandleWrite without the socket: size limit, then pin, then the payload lands at pin.data().
void ReceiveWrite(const FrameHeader& header) {
  static Regions* regions = new Regions();
  if (header.length > kMaxFrameBytes) return;  // NACKed before any lookup
  const wb::transport::RegionInfo* region = regions->Find(header.region_id);
  // Keys are 64 random bits no fuzzer guesses; key 0 (never issued) stands for "the right key".
  const uint64_t key = (header.key == 0 && region != nullptr) ? region->key : header.key;
  auto pin = regions->table.PinRemoteWrite(header.region_id, key, header.offset, header.length);
  if (!pin.ok()) {
    const auto code = pin.status().code();
    CHECK_INVARIANT(code == absl::StatusCode::kNotFound ||
                    code == absl::StatusCode::kPermissionDenied ||
                    code == absl::StatusCode::kOutOfRange);
    CHECK_INVARIANT(
        absl::StrContains(pin.status().message(), absl::StrCat("region ", header.region_id)));
    return;
  }
  CHECK_INVARIANT(region != nullptr);
  CHECK_INVARIANT(region->access == wb::transport::Access::kDestination);
  CHECK_INVARIANT(key == region->key);
  CHECK_INVARIANT(header.offset <= region->length);
  CHECK_INVARIANT(header.length <= region->length - header.offset);
  CHECK_INVARIANT(pin->data() == region->addr + header.offset);
  std::memset(pin->data(), 0xA5, header.length);  // ASan: must stay inside the buffer
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
      wb::fuzz::Fail(kTarget, "parsed a frame type outside the enum");
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

  if (header.type == FrameType::kWrite) ReceiveWrite(header);
  return 0;
}
