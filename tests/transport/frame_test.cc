// The tcp frame codec: what ParseFrameHeader accepts and what it refuses, and with what words.
#include "daemon/transport/tcp/frame.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

namespace wb::transport::tcp {
namespace {

std::string ParseError(const uint8_t* raw, size_t size = kFrameHeaderBytes) {
  auto parsed = ParseFrameHeader(raw, size);
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST_CASE("a frame header survives encode and parse", "[frame]") {
  FrameHeader in;
  in.type = FrameType::kWrite;
  in.aux = 7;
  in.region_id = 0x0102030405060708;
  in.key = 0xfedcba9876543210;
  in.offset = 1ull << 40;
  in.length = 12345;
  in.batch_id = 99;
  in.step = 0xa1b2c3d4e5f60718;
  uint8_t raw[kFrameHeaderBytes];
  EncodeFrameHeader(in, raw);
  CHECK(raw[0] == 'W');  // little-endian magic reads "WBTF"
  CHECK(raw[3] == 'F');
  auto out = ParseFrameHeader(raw, sizeof(raw));
  REQUIRE(out.ok());
  CHECK(out->type == in.type);
  CHECK(out->aux == in.aux);
  CHECK(out->region_id == in.region_id);
  CHECK(out->key == in.key);
  CHECK(out->offset == in.offset);
  CHECK(out->length == in.length);
  CHECK(out->batch_id == in.batch_id);
  CHECK(out->step == in.step);
  // Since version 2 (now 3): the step id is the header's last 8 bytes, little-endian.
  CHECK(kFrameHeaderBytes == 64);
  CHECK(raw[4] == 3);
  CHECK(raw[56] == 0x18);
  CHECK(raw[63] == 0xa1);
}

TEST_CASE("malformed frame headers are refused with a reason", "[frame]") {
  FrameHeader header;
  header.type = FrameType::kWrite;
  header.length = 10;
  uint8_t raw[kFrameHeaderBytes];
  EncodeFrameHeader(header, raw);

  CHECK_THAT(ParseError(raw, kFrameHeaderBytes - 1), Catch::Contains("truncated"));
  CHECK_THAT(ParseError(nullptr, 0), Catch::Contains("truncated"));

  uint8_t bad[kFrameHeaderBytes];
  std::memcpy(bad, raw, sizeof(raw));
  bad[0] ^= 1;
  CHECK_THAT(ParseError(bad), Catch::Contains("magic"));

  std::memcpy(bad, raw, sizeof(raw));
  bad[4] = 9;
  CHECK_THAT(ParseError(bad), Catch::Contains("version 9"));

  // A version-1 peer (no step id) is refused, not misread.
  std::memcpy(bad, raw, sizeof(raw));
  bad[4] = 1;
  CHECK_THAT(ParseError(bad), Catch::Contains("unsupported frame version 1"));
  // A version-2 peer (tensor-relative offsets, no buffers) likewise.
  bad[4] = 2;
  CHECK_THAT(ParseError(bad), Catch::Contains("unsupported frame version 2"));

  std::memcpy(bad, raw, sizeof(raw));
  bad[5] = 0;
  CHECK_THAT(ParseError(bad), Catch::Contains("unknown frame type 0"));
  bad[5] = 6;
  CHECK_THAT(ParseError(bad), Catch::Contains("unknown frame type 6"));

  std::memcpy(bad, raw, sizeof(raw));
  bad[13] = 1;
  CHECK_THAT(ParseError(bad), Catch::Contains("reserved"));
}

TEST_CASE("per-type payload rules", "[frame]") {
  // Each header (all other fields zero) and the words its refusal must contain.
  struct Case {
    FrameType type;
    uint64_t offset;
    uint64_t length;
    uint32_t aux;
    const char* refusal;
  };
  const Case cases[] = {
      {FrameType::kWrite, 0, 0, 0, "no payload"},
      {FrameType::kWrite, ~uint64_t{0} - 5, 10, 0, "overflows"},
      {FrameType::kHello, 0, kMaxControlPayload + 1, 0, "exceeds"},
      {FrameType::kFlush, 0, 0, 0, "zero connections"},
      {FrameType::kFlush, 0, 4, 1, "FLUSH frame with a payload"},
      {FrameType::kAck, 0, 1, 0, "ACK frame with a payload"},
  };
  for (const Case& c : cases) {
    INFO(c.refusal);
    FrameHeader header;
    header.type = c.type;
    header.offset = c.offset;
    header.length = c.length;
    header.aux = c.aux;
    uint8_t raw[kFrameHeaderBytes];
    EncodeFrameHeader(header, raw);
    CHECK_THAT(ParseError(raw), Catch::Contains(c.refusal));
  }
}

TEST_CASE("random bytes are parsed or refused, never trusted blindly", "[frame]") {
  std::mt19937_64 rng(1234);
  uint8_t raw[kFrameHeaderBytes];
  int accepted = 0;
  for (int i = 0; i < 100000; ++i) {
    for (auto& b : raw) b = static_cast<uint8_t>(rng());
    // Half the time keep a valid prefix so that the later checks are reached.
    if (i % 2 == 0) {
      FrameHeader h;
      h.type = static_cast<FrameType>(1 + rng() % 5);
      uint8_t valid[kFrameHeaderBytes];
      EncodeFrameHeader(h, valid);
      std::memcpy(raw, valid, 16);
    }
    auto parsed = ParseFrameHeader(raw, sizeof(raw));
    if (!parsed.ok()) continue;
    ++accepted;
    if (parsed->type == FrameType::kWrite) {
      CHECK(parsed->length > 0);
      CHECK(parsed->offset + parsed->length >= parsed->offset);
    }
    if (parsed->type == FrameType::kHello || parsed->type == FrameType::kNack) {
      CHECK(parsed->length <= kMaxControlPayload);
    }
  }
  CHECK(accepted > 0);
}

}  // namespace
}  // namespace wb::transport::tcp
