// Step-link sealing (common/steplink): frames open only at the other end, once, in order; the
// wire format is checked against OpenSSL's AES-256-GCM called directly with the documented nonce
// (direction, then message count, little-endian), so the format is pinned independently of the
// code under test; FrameReader cuts a byte stream into frames whatever the read boundaries.
#include "common/steplink/link_cipher.h"

#include <openssl/evp.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

namespace wb::steplink {
namespace {

const std::string kKey(32, '\x5a');

// AES-256-GCM decryption of `cipher_and_tag` under `key`, nonce = dir (4 bytes LE) + count
// (8 bytes LE), straight from OpenSSL.
bool ReferenceOpen(const std::string& key, uint32_t dir, uint64_t count,
                   const std::string& cipher_and_tag, std::string* plain) {
  unsigned char nonce[12];
  for (int i = 0; i < 4; ++i) nonce[i] = static_cast<unsigned char>(dir >> (8 * i));
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(count >> (8 * i));
  const size_t n = cipher_and_tag.size() - 16;
  plain->assign(n, '\0');
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int len = 0;
  bool ok =
      EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key.data()), nonce) == 1 &&
      EVP_DecryptUpdate(ctx, reinterpret_cast<unsigned char*>(plain->data()), &len,
                        reinterpret_cast<const unsigned char*>(cipher_and_tag.data()),
                        static_cast<int>(n)) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16,
                          const_cast<char*>(cipher_and_tag.data() + n)) == 1 &&
      EVP_DecryptFinal_ex(ctx, reinterpret_cast<unsigned char*>(plain->data()) + len, &len) == 1;
  EVP_CIPHER_CTX_free(ctx);
  return ok;
}

uint32_t LengthOf(const std::string& frame) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<unsigned char>(frame[i])) << (8 * i);
  return n;
}

TEST_CASE("frames follow the documented format and open at the other end in order") {
  auto controller = LinkCipher::Create(kKey, Direction::kToAgent);
  auto agent = LinkCipher::Create(kKey, Direction::kToController);
  REQUIRE(controller.ok());
  REQUIRE(agent.ok());
  const std::vector<std::string> messages = {"", "begin", std::string(70000, 'q')};
  for (size_t i = 0; i < messages.size(); ++i) {
    std::string frame;
    REQUIRE(controller->Seal(messages[i], &frame).ok());
    REQUIRE(frame.size() == 4 + messages[i].size() + 16);
    CHECK(LengthOf(frame) == messages[i].size() + 16);
    if (messages[i].size() > 8) {
      CHECK(frame.find(messages[i].substr(0, 8)) == std::string::npos);  // not in clear
    }
    std::string reference;
    CHECK(ReferenceOpen(kKey, 1, i, frame.substr(4), &reference));
    CHECK(reference == messages[i]);
    std::string plain;
    REQUIRE(agent->Open(frame.substr(4), &plain).ok());
    CHECK(plain == messages[i]);
  }
  // The other way uses direction 2.
  std::string reply;
  REQUIRE(agent->Seal("ok", &reply).ok());
  std::string reference;
  CHECK(ReferenceOpen(kKey, 2, 0, reply.substr(4), &reference));
  CHECK_FALSE(ReferenceOpen(kKey, 1, 0, reply.substr(4), &reference));
  std::string plain;
  REQUIRE(controller->Open(reply.substr(4), &plain).ok());
  CHECK(plain == "ok");
}

TEST_CASE("tampered, replayed, reordered, reflected or foreign frames do not open") {
  auto controller = LinkCipher::Create(kKey, Direction::kToAgent);
  auto agent = LinkCipher::Create(kKey, Direction::kToController);
  std::string f0, f1;
  REQUIRE(controller->Seal("first", &f0).ok());
  REQUIRE(controller->Seal("second", &f1).ok());
  std::string plain;
  SECTION("one flipped bit, in the text or in the tag") {
    for (size_t at : {size_t{4}, f0.size() - 1}) {
      std::string bad = f0;
      bad[at] ^= 0x01;
      auto fresh = LinkCipher::Create(kKey, Direction::kToController);
      CHECK(fresh->Open(bad.substr(4), &plain).code() == absl::StatusCode::kPermissionDenied);
    }
  }
  SECTION("out of order") { CHECK_FALSE(agent->Open(f1.substr(4), &plain).ok()); }
  SECTION("replayed") {
    REQUIRE(agent->Open(f0.substr(4), &plain).ok());
    CHECK_FALSE(agent->Open(f0.substr(4), &plain).ok());
    CHECK(agent->received() == 1);
  }
  SECTION("reflected back to its sender") {
    CHECK_FALSE(controller->Open(f0.substr(4), &plain).ok());
  }
  SECTION("under another key") {
    auto other = LinkCipher::Create(std::string(32, '\x5b'), Direction::kToController);
    CHECK_FALSE(other->Open(f0.substr(4), &plain).ok());
  }
  SECTION("shorter than a tag") {
    CHECK(agent->Open("short", &plain).code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE("OpenEach hands over messages in order and stops at the first refused or forged one") {
  auto sender = LinkCipher::Create(kKey, Direction::kToAgent);
  auto receiver = LinkCipher::Create(kKey, Direction::kToController);
  std::string stream;
  for (const char* m : {"one", "two", "three"}) REQUIRE(sender->Seal(m, &stream).ok());
  FrameReader reader;
  reader.Append(stream.data(), stream.size());
  std::vector<std::string> got;
  auto s = receiver->OpenEach(&reader, [&](const std::string& m) {
    got.push_back(m);
    return m == "two" ? absl::DataLossError("not wanted") : absl::OkStatus();
  });
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(got == std::vector<std::string>{"one", "two"});
  // A forged frame stops it before `take`.
  std::string forged;
  REQUIRE(sender->Seal("four", &forged).ok());
  forged.back() ^= 1;
  FrameReader bad;
  bad.Append(forged.data(), forged.size());
  int taken = 0;
  CHECK_FALSE(receiver
                  ->OpenEach(&bad,
                             [&](const std::string&) {
                               ++taken;
                               return absl::OkStatus();
                             })
                  .ok());
  CHECK(taken == 0);
}

TEST_CASE("OpenEmptyFrame accepts exactly the peer's next sealed empty frame") {
  auto sender = LinkCipher::Create(kKey, Direction::kToAgent);
  std::string empty, full;
  REQUIRE(sender->Seal("", &empty).ok());
  REQUIRE(sender->Seal("x", &full).ok());
  auto receiver = LinkCipher::Create(kKey, Direction::kToController);
  CHECK_FALSE(receiver->OpenEmptyFrame(empty.substr(0, empty.size() - 1)).ok());  // short
  CHECK(receiver->OpenEmptyFrame(empty).ok());
  CHECK_FALSE(receiver->OpenEmptyFrame(empty).ok());  // replayed
  CHECK_FALSE(receiver->OpenEmptyFrame(full).ok());   // not empty
}

TEST_CASE("keys of the wrong size are refused") {
  CHECK(LinkCipher::Create(std::string(16, 'k'), Direction::kToAgent).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(LinkCipher::Create("", Direction::kToAgent).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("RandomBytes gives distinct keys") {
  auto a = RandomBytes(32), b = RandomBytes(32);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->size() == 32);
  CHECK(*a != *b);
}

TEST_CASE("FrameReader cuts frames out of a stream read in any pieces") {
  auto sender = LinkCipher::Create(kKey, Direction::kToAgent);
  std::string stream;
  for (int i = 0; i < 20; ++i) REQUIRE(sender->Seal(std::string(i * 37, 'a' + i), &stream).ok());
  for (size_t piece : {size_t{1}, size_t{3}, size_t{64}, stream.size()}) {
    INFO("pieces of " << piece);
    auto receiver = LinkCipher::Create(kKey, Direction::kToController);
    FrameReader reader;
    int got = 0;
    for (size_t at = 0; at < stream.size(); at += piece) {
      reader.Append(stream.data() + at, std::min(piece, stream.size() - at));
      std::string_view body;
      while (true) {
        auto has = reader.Next(&body);
        REQUIRE(has.ok());
        if (!*has) break;
        std::string plain;
        REQUIRE(receiver->Open(body, &plain).ok());
        CHECK(plain == std::string(got * 37, 'a' + got));
        ++got;
      }
    }
    CHECK(got == 20);
    CHECK(reader.buffered() == 0);
  }
}

TEST_CASE("FrameReader refuses lengths under a tag or over its limit") {
  for (uint32_t n : {uint32_t{0}, uint32_t{15}, uint32_t{1001}}) {
    FrameReader reader(1000);
    char len[4];
    for (int i = 0; i < 4; ++i) len[i] = static_cast<char>(n >> (8 * i));
    reader.Append(len, 4);
    std::string_view body;
    CHECK(reader.Next(&body).status().code() == absl::StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace wb::steplink
