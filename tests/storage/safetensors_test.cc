// The safetensors reader/writer: files round trip byte for byte with their metadata, writes
// leave no temporary file behind, and every kind of malformed file is refused with an error
// that names the file and, where there is one, the tensor.
#include "daemon/storage/safetensors.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace wb::storage {
namespace {

// A file made by hand: the 8-byte length, `header` as given, then `data_bytes` bytes.
std::vector<uint8_t> Raw(const std::string& header, size_t data_bytes, int64_t len = -1) {
  // Sized once and filled with memcpy: GCC 12 reports a false -Warray-bounds for
  // vector::insert after a fixed 8-byte vector.
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0x5a);
  const uint64_t n = len < 0 ? header.size() : static_cast<uint64_t>(len);
  std::memcpy(out.data(), &n, 8);
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string ParseError(std::vector<uint8_t> bytes) {
  auto f = SafetensorsFile::Parse(std::move(bytes), "/data/v7.safetensors");
  REQUIRE_FALSE(f.ok());
  return std::string(f.status().message());
}

}  // namespace

TEST_CASE("tensors and metadata round trip through a file", "[safetensors]") {
  const std::string dir = wb::testing::TempDir("wb-st-");
  const std::string path = dir + "/a.safetensors";
  std::vector<uint8_t> w(2 * 3 * 2), idx(4 * 4), scalar(4);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<uint8_t>(200 - i);
  scalar = {1, 2, 3, 4};
  auto written = WriteSafetensors(path,
                                  {{"model.w", "BF16", {2, 3}, w},
                                   {"model.w.indices", "U32", {4}, idx},
                                   {"scale", "F32", {}, scalar},
                                   {"none.indices", "U8", {0}, {}},
                                   {"none.values", "BF16", {0}, {}}},
                                  {{"version", "7"}, {"format", "test"}});
  REQUIRE(written.ok());
  CHECK(access((path + ".tmp").c_str(), F_OK) != 0);  // renamed into place

  auto f = SafetensorsFile::Read(path);
  INFO((f.ok() ? "" : std::string(f.status().message())));
  REQUIRE(f.ok());
  CHECK(f->bytes().size() == written->bytes);
  StreamHash h;
  h.Update(f->bytes());
  CHECK(h.Final() == written->checksum);
  CHECK(f->metadata() == std::map<std::string, std::string>{{"version", "7"}, {"format", "test"}});
  REQUIRE(f->tensors().size() == 5);
  CHECK(f->Find("none.values")->elements() == 0);  // empty tensors share offsets, harmlessly
  const TensorEntry* e = f->Find("model.w");
  REQUIRE(e != nullptr);
  CHECK(e->dtype == "BF16");
  CHECK(e->shape == std::vector<int64_t>{2, 3});
  auto data = f->Data(*e);
  CHECK(std::vector<uint8_t>(data.begin(), data.end()) == w);
  auto di = f->Data(*f->Find("model.w.indices"));
  CHECK(std::vector<uint8_t>(di.begin(), di.end()) == idx);
  CHECK(f->Find("scale")->shape.empty());
  // The header length is little-endian and the data starts 8-byte aligned.
  uint64_t header_len = 0;
  std::memcpy(&header_len, f->bytes().data(), 8);
  CHECK(header_len % 8 == 0);
  CHECK(8 + header_len + w.size() + idx.size() + scalar.size() == written->bytes);
}

TEST_CASE("the writer refuses what it cannot describe", "[safetensors]") {
  const std::string path = wb::testing::TempDir("wb-st-") + "/b.safetensors";
  std::vector<uint8_t> four(4);
  auto s = WriteSafetensors(path, {{"x", "BF16", {3}, four}}, {});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.status().message()),
             Catch::Contains("tensor 'x': 4 bytes do not match its shape and dtype"));
  s = WriteSafetensors(path, {{"x", "Q7", {1}, four}}, {});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.status().message()), Catch::Contains("unknown dtype 'Q7'"));
  s = WriteSafetensors(path, {{"x", "U8", {4}, four}, {"x", "U8", {4}, four}}, {});
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.status().message()), Catch::Contains("'x' is used twice"));
  CHECK(access(path.c_str(), F_OK) != 0);
}

TEST_CASE("malformed files are refused with the file and tensor named", "[safetensors]") {
  const std::string ok_tensor = R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  REQUIRE(SafetensorsFile::Parse(Raw(ok_tensor, 4), "x").ok());

  CHECK_THAT(ParseError({1, 2, 3}),
             Catch::Contains("/data/v7.safetensors: not a valid safetensors file: 3 bytes is "
                             "shorter than the 8-byte header length"));
  CHECK_THAT(ParseError(Raw(ok_tensor, 4, 5000)),
             Catch::Contains("header length 5000 exceeds the") && Catch::Contains("truncated"));
  CHECK_THAT(ParseError(Raw("{not json", 0)), Catch::Contains("the header is not a JSON object"));
  CHECK_THAT(ParseError(Raw("[1,2]", 0)), Catch::Contains("the header is not a JSON object"));
  CHECK_THAT(ParseError(Raw(R"({"w":{"dtype":"Q7","shape":[4],"data_offsets":[0,4]}})", 4)),
             Catch::Contains("tensor 'w': unknown dtype \"Q7\""));
  CHECK_THAT(ParseError(Raw(R"({"w":{"dtype":"U8","shape":[4]}})", 4)),
             Catch::Contains("tensor 'w': needs dtype, shape and data_offsets"));
  CHECK_THAT(ParseError(Raw(R"({"w":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", 4)),
             Catch::Contains("tensor 'w': bad dimension -4"));
  CHECK_THAT(ParseError(Raw(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}})", 4)),
             Catch::Contains("tensor 'w': data_offsets [4,0] is not [begin, end]"));
  CHECK_THAT(ParseError(Raw(ok_tensor, 3)),
             Catch::Contains("tensor 'w': data_offsets [0, 4] exceed the 3 data bytes"));
  CHECK_THAT(ParseError(Raw(R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,4]}})", 4)),
             Catch::Contains("tensor 'w': 4 data bytes do not match shape [4] of BF16"));
  CHECK_THAT(ParseError(Raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                            4)),
             Catch::Contains("tensor 'b': data_offsets [2, 4] overlap another tensor"));
  CHECK_THAT(ParseError(Raw(ok_tensor, 6)),
             Catch::Contains("2 bytes after the last tensor belong to none"));
  CHECK_THAT(ParseError(Raw(R"({"__metadata__":{"version":7}})", 0)),
             Catch::Contains("__metadata__ key 'version' is not a string"));
}

TEST_CASE("a truncated file on disk is refused naming it", "[safetensors]") {
  const std::string path = wb::testing::TempDir("wb-st-") + "/c.safetensors";
  std::vector<uint8_t> data(1000, 3);
  REQUIRE(WriteSafetensors(path, {{"w", "BF16", {500}, data}}, {}).ok());
  REQUIRE(truncate(path.c_str(), 600) == 0);
  auto f = SafetensorsFile::Read(path);
  REQUIRE_FALSE(f.ok());
  CHECK_THAT(std::string(f.status().message()),
             Catch::Contains(path + ": not a valid safetensors file: tensor 'w': data_offsets"));
  auto missing = SafetensorsFile::Read(path + ".gone");
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("cannot open " + path));
}

}  // namespace wb::storage
