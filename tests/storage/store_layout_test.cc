// The storage directory's names and manifests as a subscriber reads them from a directory anyone
// may write: version names are parsed strictly (no wrap past 2^64 - 1, no other spelling of a
// version), manifests are checked field by field and, under a storage key, by their MAC; shard
// metadata whose sizes would overflow is refused.
#include "daemon/storage/store_layout.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon/storage/delta_store.h"
#include "daemon/storage/manifest_mac.h"
#include "daemon/storage/safetensors.h"
#include "daemon/storage/sparse_file.h"
#include "tests/support/process.h"

namespace wb::storage {
namespace {

using json = nlohmann::json;

std::string Refusal(const std::string& name) {
  uint64_t v = 0;
  std::string rest;
  absl::Status s = ParseVersionName(name, &v, &rest);
  return s.ok() ? "accepted as " + std::to_string(v) : std::string(s.message());
}

}  // namespace

TEST_CASE("version names: exactly 20 digits, 1 to 2^64 - 1, nothing else") {
  uint64_t v = 0;
  std::string rest;
  REQUIRE(ParseVersionName("00000000000000000042.train-0.json", &v, &rest).ok());
  CHECK(v == 42);
  CHECK(rest == "train-0.json");
  REQUIRE(ParseVersionName("18446744073709551615.w.json", &v, &rest).ok());
  CHECK(v == 18446744073709551615ull);

  // 2^64 and 2^64 + 1 used to wrap to 0 and 1.
  CHECK_THAT(Refusal("18446744073709551616.w.json"), Catch::Contains("is above 2^64 - 1"));
  CHECK_THAT(Refusal("18446744073709551617.w.json"),
             Catch::Contains("version number 18446744073709551617 is above 2^64 - 1"));
  CHECK_THAT(Refusal("99999999999999999999.w.json"), Catch::Contains("is above 2^64 - 1"));
  // Other spellings of version 1: shorter, longer (leading zeros), 25 digits.
  CHECK_THAT(Refusal("0000000000000000001.w.json"),
             Catch::Contains("has 19 digits; version names have exactly 20"));
  CHECK_THAT(Refusal("000000000000000000001.w.json"), Catch::Contains("has 21 digits"));
  CHECK_THAT(Refusal("0000018446744073709551617.w.json"), Catch::Contains("has 25 digits"));
  CHECK_THAT(Refusal("1.w.json"), Catch::Contains("has 1 digits"));
  // Signs, spaces, junk, version 0, nothing after the number.
  for (const char* name : {"+0000000000000000001.w.json", " 0000000000000000001.w.json",
                           "-0000000000000000001.w.json", "x00000000000000000001.w.json"}) {
    INFO(name);
    CHECK_THAT(Refusal(name), Catch::Contains("does not start with a version number"));
  }
  CHECK_THAT(Refusal("00000000000000000000.w.json"), Catch::Contains("version 0"));
  CHECK_THAT(Refusal("00000000000000000001"), Catch::Contains("not followed by"));
  CHECK_THAT(Refusal("00000000000000000001."), Catch::Contains("not followed by"));
  CHECK_THAT(Refusal("00000000000000000001_w.json"), Catch::Contains("not followed by"));
  CHECK_FALSE(SplitVersion("18446744073709551617.w.json", &v, &rest));
}

TEST_CASE("a directory listing skips names that are not manifest names, saying why") {
  const std::string dir = testing::TempDir("wb-layout-");
  for (const char* name :
       {"18446744073709551617.w.json", "0000018446744073709551617.w.json", "notes.json",
        "00000000000000000003.bad.name.json", "00000000000000000003.w.0.safetensors"}) {
    std::ofstream(dir + "/" + name) << "{}";
  }
  std::vector<std::string> ignored;
  auto versions = ListVersions(dir, "", &ignored);
  REQUIRE(versions.ok());
  CHECK(versions->empty());  // in particular, nothing was read as version 1
  std::sort(ignored.begin(), ignored.end());
  REQUIRE(ignored.size() == 4);
  CHECK_THAT(ignored[0], Catch::StartsWith("00000000000000000003.bad.name.json: the writer name"));
  CHECK_THAT(ignored[1], Catch::StartsWith("0000018446744073709551617.w.json: its version "
                                           "number has 25 digits"));
  CHECK_THAT(ignored[2], Catch::StartsWith("18446744073709551617.w.json: version number "
                                           "18446744073709551617 is above 2^64 - 1"));
  CHECK_THAT(ignored[3], Catch::StartsWith("notes.json: does not start with a version number"));
}

namespace {

json GoodManifest() {
  return json{{"format", kStoreFormat},
              {"version", 7},
              {"base_version", 6},
              {"kind", "delta"},
              {"writer", "w"},
              {"files",
               {{{"name", "00000000000000000007.w.0.safetensors"},
                 {"bytes", 100},
                 {"checksum", "0123456789abcdef"},
                 {"sha256", std::string(64, 'a')}}}}};
}

std::string ToHex(const std::string& bytes) {
  std::string out;
  char two[3];
  for (unsigned char c : bytes) {
    std::snprintf(two, sizeof(two), "%02x", c);
    out += two;
  }
  return out;
}

// Runs `openssl <args>` and returns its output.
std::string Openssl(const std::string& args) {
  std::string out;
  FILE* p = popen(("openssl " + args + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[256];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  pclose(p);
  INFO(out);
  return out;
}

std::string Error(const json& j, const std::string& key = "") {
  return ParseManifest(j.dump(), "m.json", 7, "w", key).error;
}

}  // namespace

TEST_CASE("manifests are parsed strictly") {
  CHECK(Error(GoodManifest()).empty());
  auto with = [](const std::string& key, json value) {
    json j = GoodManifest();
    j[key] = std::move(value);
    return Error(j);
  };
  CHECK_THAT(with("version", 8), Catch::Contains("version differs from its name"));
  CHECK_THAT(with("version", 7.0), Catch::Contains("version differs from its name"));
  CHECK_THAT(with("version", -7), Catch::Contains("version differs from its name"));
  CHECK_THAT(with("writer", "other"), Catch::Contains("writer differs from its name"));
  CHECK_THAT(with("base_version", -1), Catch::Contains("base_version is not a number"));
  CHECK_THAT(with("base_version", 7), Catch::Contains("a delta on base version 7 of version 7"));
  CHECK_THAT(with("kind", "anchor"), Catch::Contains("an anchor on base version 6"));
  CHECK_THAT(with("kind", "sideways"), Catch::Contains("kind is neither"));
  CHECK_THAT(with("files", json::array()), Catch::Contains("files is empty"));
  auto file = [](const std::string& key, json value) {
    json j = GoodManifest();
    j["files"][0][key] = std::move(value);
    return Error(j);
  };
  CHECK_THAT(file("bytes", -100), Catch::Contains("needs name, bytes and checksum"));
  CHECK_THAT(file("bytes", 1e30), Catch::Contains("needs name, bytes and checksum"));
  CHECK_THAT(file("checksum", "xyz"), Catch::Contains("checksum"));
  CHECK_THAT(file("sha256", "abc"), Catch::Contains("sha256 is not 64 hex digits"));
  // A manifest may name only its own version's and writer's rank files.
  for (const char* name :
       {"00000000000000000006.w.0.safetensors", "00000000000000000007.v.0.safetensors",
        "../00000000000000000007.w.0.safetensors", "00000000000000000007.w.json",
        "00000000000000000007.w..safetensors", "00000000000000000007.w.x.safetensors"}) {
    INFO(name);
    CHECK_THAT(file("name", name), Catch::Contains("is not named 00000000000000000007.w.<rank>"));
  }
  json twice = GoodManifest();
  twice["files"].push_back(twice["files"][0]);
  CHECK_THAT(Error(twice), Catch::Contains("twice"));
  CHECK_THAT(ParseManifest("[1, 2]", "m.json", 7, "w", "").error,
             Catch::Contains("not a JSON object"));
}

TEST_CASE("under a storage key, a manifest needs the MAC of that key") {
  const std::string key = DeriveManifestKey("cluster-token");
  CHECK(key.size() == 32);
  CHECK(key != DeriveManifestKey("cluster-token2"));
  // HMAC-SHA256("cluster-token", "weightbeam storage manifest v1"), computed with
  // `printf %s 'weightbeam storage manifest v1' | openssl dgst -sha256 -hmac cluster-token`.
  const std::string key_hex = "f54292140a1d74db3cd963e25028c9c5daec2a22415a6a89b73fd458156754eb";
  CHECK(ToHex(key) == key_hex);
  const std::string abc = "abc";  // FIPS 180-2's example
  CHECK(Sha256Hex(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(abc.data()), 3)) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

  json j = GoodManifest();
  Manifest m = ParseManifest(j.dump(), "m.json", 7, "w", "");
  REQUIRE(m.error.empty());
  j["mac"] = ManifestMac(key, m);
  {  // the MAC is HMAC-SHA256 of the canonical contents, as openssl computes it
    const std::string dir = testing::TempDir("wb-layout-");
    std::ofstream(dir + "/canonical", std::ios::binary) << CanonicalManifest(m);
    CHECK(Openssl("dgst -sha256 -mac HMAC -macopt hexkey:" + key_hex + " " + dir + "/canonical")
              .find("= " + j["mac"].get<std::string>().substr(12)) != std::string::npos);
  }
  // The canonical layout, computed independently in Python (as tests/fuzz/make_manifest_seeds.py
  // does): HMAC-SHA256(key, label line + "<length>:<field>\n" for format, version, base, kind,
  // writer, file count, then each file's name, bytes, checksum, sha256).
  CHECK(j["mac"].get<std::string>() ==
        "hmac-sha256:f2826e02214f38de48437ba1a25ec22137b653526b37fe051fa5bcc959f29328");
  CHECK(Error(j, key).empty());
  CHECK(Error(j).empty());  // without a key the MAC is not read

  CHECK_THAT(Error(GoodManifest(), key), Catch::Contains("carries no MAC"));
  CHECK_THAT(Error(j, DeriveManifestKey("another-token")), Catch::Contains("MAC does not match"));
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"bytes", 101}, {"checksum", "0123456789abcdee"}, {"sha256", std::string(64, 'b')}}) {
    json altered = j;
    altered["files"][0][field] = value;
    INFO(field);
    CHECK_THAT(Error(altered, key), Catch::Contains("MAC does not match"));
  }
  json rebased = j;
  rebased["base_version"] = 5;
  CHECK_THAT(Error(rebased, key), Catch::Contains("MAC does not match"));
  json unhashed = GoodManifest();
  unhashed["files"][0].erase("sha256");
  Manifest u = ParseManifest(unhashed.dump(), "m.json", 7, "w", "");
  unhashed["mac"] = ManifestMac(key, u);
  CHECK_THAT(Error(unhashed, key), Catch::Contains("has no sha256"));
}

TEST_CASE("under a key, a publisher resumes after its own signed manifests only") {
  const std::string dir = testing::TempDir("wb-layout-");
  // A forged (unsigned) manifest of this writer at the highest version.
  json forged = GoodManifest();
  forged["version"] = 18446744073709551615ull;
  forged["files"][0]["name"] = "18446744073709551615.w.0.safetensors";
  std::ofstream(dir + "/18446744073709551615.w.json") << forged.dump();
  std::vector<uint16_t> data(8, 1);
  weightbeam::v1::TensorSpec spec;
  spec.set_name("t");
  spec.set_dtype(weightbeam::v1::DTYPE_BF16);
  spec.add_global_shape(8);
  ShardBuffer source{spec, 0, absl::MakeSpan(reinterpret_cast<uint8_t*>(data.data()), 16), 1};
  StoreOptions options;
  options.dir = dir;
  options.writer = "w";
  options.manifest_key = DeriveManifestKey("cluster-token");
  DeltaPublisher publisher(options);
  REQUIRE(publisher.Resume().ok());
  auto first = publisher.Publish(1, {source});
  INFO((first.ok() ? "" : std::string(first.status().message())));
  REQUIRE(first.ok());
  // Its own signed manifest counts: a restarted publisher continues after version 1.
  DeltaPublisher restarted(options);
  REQUIRE(restarted.Resume().ok());
  CHECK_FALSE(restarted.Publish(1, {source}).ok());
  CHECK(restarted.Publish(2, {source}).ok());
}

TEST_CASE("shard metadata whose sizes overflow is refused") {
  const std::string dir = testing::TempDir("wb-layout-");
  const std::vector<uint8_t> five(10);
  auto collect = [&](const json& shard) {
    const std::string path = dir + "/f.safetensors";
    REQUIRE(
        WriteSafetensors(path, {{"x", "BF16", {5}, five}},
                         {{"format", kStoreFormat}, {"version", "1"}, {"shard:x", shard.dump()}})
            .ok());
    auto f = SafetensorsFile::Read(path);
    REQUIRE(f.ok());
    std::map<std::string, std::vector<Source>> sources;
    return CollectSources(*f, 1, sources);
  };
  const int64_t big = std::numeric_limits<int64_t>::max();
  json ok = {{"dtype", "BF16"},
             {"global_shape", {10}},
             {"start", {5}},
             {"size", {5}},
             {"encoding", "dense"}};
  CHECK(collect(ok).ok());
  // start + size wraps past 2^63 and used to pass `start + size <= global`.
  json wrap = ok;
  wrap["global_shape"] = {big};
  wrap["start"] = {big - 1};
  CHECK_THAT(std::string(collect(wrap).message()),
             Catch::Contains("shard metadata is inconsistent"));
  // 2^40 x 2^40 elements: the element count overflows 64 bits.
  json huge = ok;
  huge["global_shape"] = {int64_t{1} << 40, int64_t{1} << 40};
  huge["start"] = {0, 0};
  huge["size"] = {1, 5};
  CHECK_THAT(std::string(collect(huge).message()),
             Catch::Contains("shard metadata is inconsistent"));
  CHECK(CheckedElements({int64_t{1} << 31, int64_t{1} << 31}) == (uint64_t{1} << 62));
  CHECK_FALSE(CheckedElements({int64_t{1} << 31, (int64_t{1} << 31) + 1}).has_value());
  CHECK_FALSE(CheckedElements({-1}).has_value());
}

}  // namespace wb::storage
