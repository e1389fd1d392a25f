#include "daemon/transport/tcp/frame.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace wb::transport::tcp {
namespace {

// Layout (little-endian):
//   0 u32 magic | 4 u8 version | 5 u8 type | 6 u16 flags (0) | 8 u32 aux | 12 u32 reserved (0)
//  16 u64 region_id | 24 u64 key | 32 u64 offset | 40 u64 length | 48 u64 batch_id
//  56 u64 step (version 2)
template <typename T>
T Load(const uint8_t* p) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(p[i]) << (8 * i);
  return value;
}

template <typename T>
void Store(uint8_t* p, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(value >> (8 * i));
}

}  // namespace

const char* FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kWrite:
      return "WRITE";
    case FrameType::kFlush:
      return "FLUSH";
    case FrameType::kAck:
      return "ACK";
    case FrameType::kNack:
      return "NACK";
  }
  return "UNKNOWN";
}

absl::StatusOr<FrameHeader> ParseFrameHeader(const uint8_t* data, size_t size) {
  if (data == nullptr || size < kFrameHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header truncated: ", size, " of ", kFrameHeaderBytes, " bytes"));
  }
  const uint32_t magic = Load<uint32_t>(data);
  if (magic != kFrameMagic) {
    return absl::InvalidArgumentError(absl::StrFormat("bad frame magic 0x%08x", magic));
  }
  if (data[4] != kFrameVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported frame version ", static_cast<int>(data[4]),
                     " (this build speaks ", static_cast<int>(kFrameVersion), ")"));
  }
  const uint8_t type = data[5];
  if (type < static_cast<uint8_t>(FrameType::kHello) ||
      type > static_cast<uint8_t>(FrameType::kNack)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown frame type ", static_cast<int>(type)));
  }
  if (Load<uint16_t>(data + 6) != 0 || Load<uint32_t>(data + 12) != 0) {
    return absl::InvalidArgumentError("frame header has non-zero reserved bits");
  }
  FrameHeader header;
  header.type = static_cast<FrameType>(type);
  header.aux = Load<uint32_t>(data + 8);
  header.region_id = Load<uint64_t>(data + 16);
  header.key = Load<uint64_t>(data + 24);
  header.offset = Load<uint64_t>(data + 32);
  header.length = Load<uint64_t>(data + 40);
  header.batch_id = Load<uint64_t>(data + 48);
  header.step = Load<uint64_t>(data + 56);

  switch (header.type) {
    case FrameType::kHello:
    case FrameType::kNack:
      if (header.length > kMaxControlPayload) {
        return absl::InvalidArgumentError(absl::StrCat(FrameTypeName(header.type), " payload of ",
                                                       header.length, " bytes exceeds ",
                                                       kMaxControlPayload));
      }
      break;
    case FrameType::kWrite:
      if (header.length == 0) return absl::InvalidArgumentError("WRITE frame with no payload");
      if (header.offset + header.length < header.offset) {
        return absl::InvalidArgumentError(absl::StrCat("WRITE frame offset ", header.offset,
                                                       " + length ", header.length, " overflows"));
      }
      break;
    case FrameType::kFlush:
      if (header.length != 0) return absl::InvalidArgumentError("FLUSH frame with a payload");
      if (header.aux == 0) return absl::InvalidArgumentError("FLUSH frame for zero connections");
      break;
    case FrameType::kAck:
      if (header.length != 0) return absl::InvalidArgumentError("ACK frame with a payload");
      break;
  }
  return header;
}

void EncodeFrameHeader(const FrameHeader& header, uint8_t* out) {
  Store<uint32_t>(out, kFrameMagic);
  out[4] = kFrameVersion;
  out[5] = static_cast<uint8_t>(header.type);
  Store<uint16_t>(out + 6, 0);
  Store<uint32_t>(out + 8, header.aux);
  Store<uint32_t>(out + 12, 0);
  Store<uint64_t>(out + 16, header.region_id);
  Store<uint64_t>(out + 24, header.key);
  Store<uint64_t>(out + 32, header.offset);
  Store<uint64_t>(out + 40, header.length);
  Store<uint64_t>(out + 48, header.batch_id);
  Store<uint64_t>(out + 56, header.step);
}

}  // namespace wb::transport::tcp
