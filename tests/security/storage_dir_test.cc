// The storage directory (issue 14, class 9) with real wb-agent processes sharing only a directory:
// whoever can write it must not be able to make a subscribing agent apply something else than
// what its publisher wrote. Version names out of range (2^64 + 1, 25 digits) are ignored with a
// log line instead of being read as version 1, and a FIFO planted as a data file is refused
// without hanging the subscriber; with a token, manifests from a writer without it
// (or with another token), a version whose data file was altered after signing, and a manifest
// altered after signing are refused naming the file, and the destination keeps the bytes of the
// last good version; genuine versions are applied. A forged version 2^64 - 1 does not make the
// subscriber skip the genuine versions after it, and an unsigned manifest of another writer
// dropped beside each genuine version never blocks it.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "tests/support/process.h"

namespace v1 = weightbeam::v1;
namespace fs = std::filesystem;
using namespace wb::client;
using wb::testing::Process;

namespace {

constexpr int64_t kRows = 64, kCols = 64;
constexpr size_t kBytes = kRows * kCols * 2;

// The BF16 bit patterns the trainer of `seed` holds at `version` (any pattern: the bytes are
// copied, never converted).
std::vector<uint16_t> Values(uint64_t version, uint32_t seed) {
  std::vector<uint16_t> v(kRows * kCols);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<uint16_t>((i * 2654435761u + version * 40503u + seed * 977u) >> 7);
  }
  return v;
}

std::string Yaml(const std::string& dir, const std::string& name, const std::string& socket,
                 const std::string& more) {
  const std::string path = dir + "/" + socket + ".yaml";
  std::ofstream(path) << "name: " << name << "\nlocal_socket: " << dir << "/" << socket
                      << ".sock\nlisten: 127.0.0.1:" << wb::testing::FreePort()
                      << "\ncontroller: 127.0.0.1:" << wb::testing::FreePort()
                      << "\ntransports:\n  tcp:\n    enabled: false\n"
                      << more;
  return path;
}

// A wb-agent named `name`, its socket and log called `socket`.
std::unique_ptr<Process> StartAgent(const std::string& dir, const std::string& name,
                                    const std::string& socket, const std::string& more) {
  auto p =
      std::make_unique<Process>(std::vector<std::string>{wb::testing::Runfile("daemon/wb-agent"),
                                                         "--config", Yaml(dir, name, socket, more)},
                                dir + "/" + socket + ".log");
  const std::string sock = dir + "/" + socket + ".sock";
  REQUIRE(wb::testing::WaitUntil([&] { return access(sock.c_str(), F_OK) == 0; },
                                 std::chrono::seconds(15)));
  return p;
}

// One 64 x 64 BF16 tensor "w", whole, registered by rank 0 of `role`.
struct Side {
  SharedBuffer buffer;
  LocalSession session;
  std::vector<uint16_t> bytes() const {
    std::vector<uint16_t> out(kRows * kCols);
    std::memcpy(out.data(), buffer.data(), kBytes);
    return out;
  }
};

Side OpenSide(const std::string& socket, v1::Role role) {
  auto buffer = SharedBuffer::Create(kBytes, "storage-dir");
  REQUIRE(buffer.ok());
  auto session = LocalSession::Connect(socket, Identity{role, 0, 0});
  REQUIRE(session.ok());
  auto s = session->Register({"w", v1::DTYPE_BF16, {kRows, kCols}, {}}, *buffer, 0, kBytes);
  INFO(s.message());
  REQUIRE(s.ok());
  if (role == v1::ROLE_INFERENCE) REQUIRE(session->Watch().ok());
  return Side{std::move(*buffer), std::move(*session)};
}

void Publish(Side& trainer, uint64_t version, uint32_t seed) {
  const auto v = Values(version, seed);
  std::memcpy(trainer.buffer.data(), v.data(), kBytes);
  auto r = trainer.session.Publish(version);
  INFO((r.ok() ? "" : std::string(r.status().message())));
  REQUIRE(r.ok());
}

std::string Prefix(uint64_t version) {
  char name[32];
  std::snprintf(name, sizeof(name), "%020llu", static_cast<unsigned long long>(version));
  return name;
}

// Copies what a publisher wrote for `version` from `from` into `to`: data files first, then the
// manifest (renamed into place last, as a publisher does), under `manifest_name` when given.
void CopyVersion(const std::string& from, const std::string& to, uint64_t version,
                 const std::string& manifest_name = "") {
  std::string manifest;
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(Prefix(version) + ".", 0) != 0) continue;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) {
      manifest = name;
      continue;
    }
    fs::copy_file(e.path(), to + "/" + name, fs::copy_options::overwrite_existing);
  }
  REQUIRE_FALSE(manifest.empty());
  fs::copy_file(from + "/" + manifest, to + "/copy.tmp", fs::copy_options::overwrite_existing);
  fs::rename(to + "/copy.tmp", to + "/" + (manifest_name.empty() ? manifest : manifest_name));
}

std::string DataFile(const std::string& dir, uint64_t version) {
  return dir + "/" + Prefix(version) + ".train-site.0.safetensors";
}
std::string ManifestFile(const std::string& dir, uint64_t version) {
  return dir + "/" + Prefix(version) + ".train-site.json";
}

void ExpectCommit(Side& inference, uint64_t version) {
  auto begin = inference.session.NextEvent(std::chrono::seconds(20));
  REQUIRE(begin.ok());
  INFO(begin->reason());
  CHECK(begin->kind() == v1::Event::KIND_BEGIN);
  CHECK(begin->version() == version);
  auto commit = inference.session.NextEvent(std::chrono::seconds(20));
  REQUIRE(commit.ok());
  CHECK(commit->kind() == v1::Event::KIND_COMMIT);
  CHECK(commit->version() == version);
}

std::string ExpectAbort(Side& inference, uint64_t version) {
  auto abort = inference.session.NextEvent(std::chrono::seconds(20));
  REQUIRE(abort.ok());
  INFO(abort->reason());
  CHECK(abort->kind() == v1::Event::KIND_ABORT);
  CHECK(abort->version() == version);
  return abort->reason();
}

}  // namespace

TEST_CASE("version names out of range are ignored, never read as another version", "[security]") {
  const std::string dir = wb::testing::TempDir("wb-stdir-");
  const std::string shared = dir + "/bucket", stage = dir + "/stage";
  fs::create_directories(shared);
  auto sub = StartAgent(dir, "infer-site", "sub",
                        "storage:\n  dir: " + shared + "\n  role: subscribe\n  poll_ms: 50\n");
  auto pub = StartAgent(dir, "train-site", "pub",
                        "storage:\n  dir: " + stage + "\n  role: publish\n  anchor_every: 1\n");
  Side inference = OpenSide(dir + "/sub.sock", v1::ROLE_INFERENCE);
  Side trainer = OpenSide(dir + "/pub.sock", v1::ROLE_TRAINER);
  Publish(trainer, 1, 0);

  // Version 1's files under names whose version is 2^64 + 1 (20 digits: it used to wrap to 1),
  // 25 digits and 19 digits.
  const std::vector<std::string> names = {"18446744073709551617.train-site.json",
                                          "0000018446744073709551617.train-site.json",
                                          "0000000000000000001.train-site.json"};
  for (const auto& name : names) CopyVersion(stage, shared, 1, name);
  const std::string log = dir + "/sub.log";
  const bool logged = wb::testing::WaitUntil(
      [&] {
        const std::string text = wb::testing::ReadFile(log);
        return text.find("ignoring " + shared + "/" + names[0] +
                         ": version number 18446744073709551617 is above 2^64 - 1") !=
                   std::string::npos &&
               text.find("ignoring " + shared + "/" + names[1] +
                         ": its version number has 25 digits") != std::string::npos &&
               text.find("ignoring " + shared + "/" + names[2] +
                         ": its version number has 19 digits") != std::string::npos;
      },
      std::chrono::seconds(10));
  INFO(wb::testing::ReadFile(log));
  CHECK(logged);
  // Nothing was applied: no event, the destination still holds zeros.
  auto none = inference.session.NextEvent(std::chrono::milliseconds(1500));
  CHECK_FALSE(none.ok());
  CHECK(inference.bytes() == std::vector<uint16_t>(kRows * kCols, 0));
  // Each is said once, not at every poll.
  const std::string text = wb::testing::ReadFile(log);
  size_t count = 0;
  const std::string said = "ignoring " + shared + "/" + names[0];
  for (size_t at = text.find(said); at != std::string::npos; at = text.find(said, at + 1)) {
    ++count;
  }
  CHECK(count == 1);

  // The genuine name is applied.
  CopyVersion(stage, shared, 1);
  ExpectCommit(inference, 1);
  CHECK(inference.bytes() == Values(1, 0));

  // A FIFO where version 2's data file should be: refused without blocking the subscriber (it
  // used to wait forever in open()), and version 3 is applied after it.
  Publish(trainer, 2, 0);
  REQUIRE(mkfifo(DataFile(shared, 2).c_str(), 0644) == 0);
  fs::copy_file(ManifestFile(stage, 2), ManifestFile(shared, 2));
  CHECK_THAT(ExpectAbort(inference, 2),
             Catch::Contains(DataFile(shared, 2) + ": not a regular file"));
  CHECK(inference.bytes() == Values(1, 0));
  Publish(trainer, 3, 0);
  CopyVersion(stage, shared, 3);
  ExpectCommit(inference, 3);
  CHECK(inference.bytes() == Values(3, 0));
  CHECK(sub->running());
}

TEST_CASE("with a token, only manifests signed with it are applied", "[security]") {
  const std::string dir = wb::testing::TempDir("wb-stdir-");
  const std::string shared = dir + "/bucket";
  std::ofstream(dir + "/token-a") << "the-cluster-token\n";
  std::ofstream(dir + "/token-b") << "another-token\n";
  fs::permissions(dir + "/token-a", fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(dir + "/token-b", fs::perms::owner_read | fs::perms::owner_write);
  fs::create_directories(shared);
  // Both sides take the cluster's token (tls.token_file). Two rogue writers under the same agent
  // name write into their own directories, copied into the shared one: one without a token, one
  // with another token.
  auto sub = StartAgent(dir, "infer-site", "sub",
                        "tls:\n  token_file: " + dir + "/token-a\nstorage:\n  dir: " + shared +
                            "\n  role: subscribe\n  poll_ms: 50\n");
  auto pub = StartAgent(dir, "train-site", "pub",
                        "tls:\n  token_file: " + dir + "/token-a\nstorage:\n  dir: " + shared +
                            "\n  role: publish\n  anchor_every: 1\n");
  auto rogue = StartAgent(dir, "train-site", "rogue",
                          "storage:\n  dir: " + dir + "/rogue\n  role: publish\n");
  auto other = StartAgent(dir, "train-site", "other",
                          "tls:\n  token_file: " + dir + "/token-b\nstorage:\n  dir: " + dir +
                              "/other\n  role: publish\n");
  Side inference = OpenSide(dir + "/sub.sock", v1::ROLE_INFERENCE);
  Side trainer = OpenSide(dir + "/pub.sock", v1::ROLE_TRAINER);
  Side rogue_trainer = OpenSide(dir + "/rogue.sock", v1::ROLE_TRAINER);
  Side other_trainer = OpenSide(dir + "/other.sock", v1::ROLE_TRAINER);
  constexpr uint32_t kGenuine = 0, kForged = 666;

  // A genuine version is applied.
  Publish(trainer, 1, kGenuine);
  ExpectCommit(inference, 1);
  REQUIRE(inference.bytes() == Values(1, kGenuine));
  {
    std::ifstream in(ManifestFile(shared, 1));
    auto manifest = nlohmann::json::parse(in);
    CHECK_THAT(manifest.at("mac").get<std::string>(), Catch::StartsWith("hmac-sha256:"));
    CHECK(manifest.at("files").at(0).at("sha256").get<std::string>().size() == 64);
  }

  // A writer without the token.
  Publish(rogue_trainer, 2, kForged);
  CopyVersion(dir + "/rogue", shared, 2);
  CHECK_THAT(ExpectAbort(inference, 2),
             Catch::Contains("version 2 refused: " + ManifestFile(shared, 2) +
                             ": bad manifest: "
                             "it carries no MAC"));
  CHECK(inference.bytes() == Values(1, kGenuine));

  // A writer with another token.
  Publish(other_trainer, 3, kForged);
  CopyVersion(dir + "/other", shared, 3);
  CHECK_THAT(ExpectAbort(inference, 3),
             Catch::Contains("version 3 refused: " + ManifestFile(shared, 3) +
                             ": bad manifest: its MAC does not match"));
  CHECK(inference.bytes() == Values(1, kGenuine));

  // A genuine version whose data file is altered after it was signed.
  sub->Signal(SIGSTOP);
  Publish(trainer, 4, kGenuine);
  {
    std::fstream io(DataFile(shared, 4), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-2, std::ios::end);
    char c = 0;
    io.read(&c, 1);
    c ^= 0x40;
    io.seekp(-2, std::ios::end);
    io.write(&c, 1);
  }
  sub->Signal(SIGCONT);
  CHECK_THAT(ExpectAbort(inference, 4),
             Catch::Contains("version 4 refused: " + DataFile(shared, 4) + ": SHA-256 ") &&
                 Catch::Contains("(altered or corrupted)"));
  CHECK(inference.bytes() == Values(1, kGenuine));

  // A genuine manifest altered after it was signed (its file's checksum rewritten).
  sub->Signal(SIGSTOP);
  Publish(trainer, 5, kGenuine);
  {
    nlohmann::json manifest;
    {
      std::ifstream in(ManifestFile(shared, 5));
      manifest = nlohmann::json::parse(in);
    }
    manifest["files"][0]["checksum"] = "0000000000000000";
    std::ofstream(ManifestFile(shared, 5), std::ios::trunc) << manifest.dump(1);
  }
  sub->Signal(SIGCONT);
  CHECK_THAT(ExpectAbort(inference, 5),
             Catch::Contains("version 5 refused: " + ManifestFile(shared, 5) +
                             ": bad manifest: its MAC does not match"));
  CHECK(inference.bytes() == Values(1, kGenuine));

  // A forged version 2^64 - 1 is refused and does not hold back the genuine versions after it.
  const uint64_t kLast = 18446744073709551615ull;
  Publish(rogue_trainer, kLast, kForged);
  CopyVersion(dir + "/rogue", shared, kLast);
  CHECK_THAT(ExpectAbort(inference, kLast), Catch::Contains("it carries no MAC"));
  CHECK(inference.bytes() == Values(1, kGenuine));
  Publish(trainer, 6, kGenuine);
  ExpectCommit(inference, 6);
  CHECK(inference.bytes() == Values(6, kGenuine));
  CHECK(sub->running());
}

TEST_CASE("storage.token_file keys manifests without a control-plane token", "[security]") {
  const std::string dir = wb::testing::TempDir("wb-stdir-");
  const std::string shared = dir + "/bucket";
  std::ofstream(dir + "/token") << "  storage-only-token \n";
  fs::permissions(dir + "/token", fs::perms::owner_read | fs::perms::owner_write);
  auto sub =
      StartAgent(dir, "infer-site", "sub",
                 "storage:\n  dir: " + shared +
                     "\n  role: subscribe\n  poll_ms: 50\n  token_file: " + dir + "/token\n");
  auto pub = StartAgent(
      dir, "train-site", "pub",
      "storage:\n  dir: " + shared + "\n  role: publish\n  token_file: " + dir + "/token\n");
  Side inference = OpenSide(dir + "/sub.sock", v1::ROLE_INFERENCE);
  Side trainer = OpenSide(dir + "/pub.sock", v1::ROLE_TRAINER);
  Publish(trainer, 1, 0);
  ExpectCommit(inference, 1);
  CHECK(inference.bytes() == Values(1, 0));
  std::ifstream in(ManifestFile(shared, 1));
  CHECK_THAT(nlohmann::json::parse(in).at("mac").get<std::string>(),
             Catch::StartsWith("hmac-sha256:"));

  // A token file that cannot be read stops the agent, naming it.
  Process bad({wb::testing::Runfile("daemon/wb-agent"), "--config",
               Yaml(dir, "infer-2", "bad",
                    "storage:\n  dir: " + shared + "\n  role: subscribe\n  token_file: " + dir +
                        "/missing\n")},
              dir + "/bad.log");
  CHECK(bad.Wait(std::chrono::seconds(15)) != 0);
  CHECK_THAT(wb::testing::ReadFile(dir + "/bad.log"),
             Catch::Contains("storage token (storage.token_file or tls.token_file): cannot open " +
                             dir + "/missing"));
}

// A writer without the token drops its own (unsigned) manifest and file beside every genuine
// version, under its own name: the genuine versions are applied all the same, and the stray
// manifest never reaches the watchers as a refusal of that version.
TEST_CASE("an unsigned manifest beside each signed version never blocks it", "[security]") {
  const std::string dir = wb::testing::TempDir("wb-stdir-");
  const std::string shared = dir + "/bucket";
  std::ofstream(dir + "/token") << "the-cluster-token\n";
  fs::permissions(dir + "/token", fs::perms::owner_read | fs::perms::owner_write);
  fs::create_directories(shared);
  const std::string keyed = "tls:\n  token_file: " + dir + "/token\nstorage:\n  dir: " + shared;
  auto sub = StartAgent(dir, "infer-site", "sub", keyed + "\n  role: subscribe\n  poll_ms: 50\n");
  auto pub = StartAgent(dir, "train-site", "pub", keyed + "\n  role: publish\n  anchor_every: 2\n");
  auto rogue = StartAgent(dir, "rogue-site", "rogue",
                          "storage:\n  dir: " + dir + "/rogue\n  role: publish\n");
  Side inference = OpenSide(dir + "/sub.sock", v1::ROLE_INFERENCE);
  Side trainer = OpenSide(dir + "/pub.sock", v1::ROLE_TRAINER);
  Side rogue_trainer = OpenSide(dir + "/rogue.sock", v1::ROLE_TRAINER);
  constexpr uint32_t kGenuine = 0, kForged = 666;
  for (uint64_t v = 1; v <= 3; ++v) {
    // The subscriber finds both manifests of the version at once.
    sub->Signal(SIGSTOP);
    Publish(trainer, v, kGenuine);
    Publish(rogue_trainer, v, kForged);
    CopyVersion(dir + "/rogue", shared, v);
    sub->Signal(SIGCONT);
    ExpectCommit(inference, v);
    CHECK(inference.bytes() == Values(v, kGenuine));
  }
  CHECK(sub->running());
}
