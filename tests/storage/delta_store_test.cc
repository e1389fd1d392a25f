// The storage path's publisher and subscriber over a real directory: an anchor then sparse
// deltas land bit for bit in destinations sharded differently from the sources; a delta on the
// wrong base, a corrupt or truncated file, and incomplete versions are never applied (the
// destination keeps the last committed bytes) and the next anchor recovers.
#include "daemon/storage/delta_store.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <random>

#include "daemon/storage/safetensors.h"
#include "daemon/transform/transform.h"
#include "tests/support/process.h"

namespace wb::storage {
namespace {

namespace v1 = weightbeam::v1;
constexpr int64_t kRows = 64, kCols = 48;

// A whole tensor of `shape`.
v1::TensorSpec WholeSpec(const std::string& name, v1::DType dtype, std::vector<int64_t> shape) {
  v1::TensorSpec s;
  s.set_name(name);
  s.set_dtype(dtype);
  for (int64_t d : shape) s.add_global_shape(d);
  return s;
}

// A [kRows, kCols] tensor, holding `shard` ({start, size} per dimension; none: all of it).
v1::TensorSpec Spec(const std::string& name, v1::DType dtype,
                    std::vector<std::pair<int64_t, int64_t>> shard) {
  v1::TensorSpec s = WholeSpec(name, dtype, {kRows, kCols});
  for (auto [start, size] : shard) {
    auto* d = s.add_shard();
    d->set_start(start);
    d->set_size(size);
  }
  return s;
}

// The full tensor of one version: random BF16, ~1% of elements changed per version.
class Model {
 public:
  std::vector<uint16_t> full = std::vector<uint16_t>(kRows * kCols);
  Model() {
    std::mt19937 rng(7);
    for (auto& v : full) v = static_cast<uint16_t>(0x3c00 + rng() % 0x400);
  }
  void Step(uint32_t version) {
    std::mt19937 rng(version);
    for (int k = 0; k < static_cast<int>(full.size()) / 100; ++k) full[rng() % full.size()] += 1;
  }
  uint16_t at(int64_t r, int64_t c) const { return full[r * kCols + c]; }
};

// A buffer holding rows [r0, r0 + rows) x cols [c0, c0 + cols).
struct Shard {
  v1::TensorSpec spec;
  int64_t r0, rows, c0, cols;
  std::vector<uint16_t> data;
  Shard(const std::string& name, int64_t r0, int64_t rows, int64_t c0, int64_t cols)
      : spec(Spec(name, v1::DTYPE_BF16, {{r0, rows}, {c0, cols}})),
        r0(r0),
        rows(rows),
        c0(c0),
        cols(cols),
        data(rows * cols) {}
  void FillFrom(const Model& m) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) data[r * cols + c] = m.at(r0 + r, c0 + c);
    }
  }
  bool Matches(const Model& m) const {
    Shard expect(spec.name(), r0, rows, c0, cols);
    expect.FillFrom(m);
    return expect.data == data;
  }
  ShardBuffer Buffer(uint64_t id, int rank) {
    return ShardBuffer{
        spec, rank, absl::MakeSpan(reinterpret_cast<uint8_t*>(data.data()), data.size() * 2), id};
  }
};

// Trainer side: two ranks, row (FSDP) shards. Inference side: two ranks, column (TP) shards.
struct Fixture {
  std::string dir = wb::testing::TempDir("wb-store-");
  Model model;
  Shard t0{"w", 0, kRows / 2, 0, kCols}, t1{"w", kRows / 2, kRows / 2, 0, kCols};
  Shard i0{"w", 0, kRows, 0, kCols / 3}, i1{"w", 0, kRows, kCols / 3, kCols - kCols / 3};
  std::vector<std::string> events;
  SubscriberHooks hooks{
      [this](uint64_t v) {
        events.push_back("begin " + std::to_string(v));
        return absl::OkStatus();
      },
      [this](uint64_t v) {
        events.push_back("commit " + std::to_string(v));
        return absl::OkStatus();
      },
      [this](uint64_t v, const std::string& why) { events.push_back("refused " + why); }};

  StoreOptions Options(int anchor_every) {
    StoreOptions o;
    o.dir = dir;
    o.writer = "trainer-node";
    o.anchor_every = anchor_every;
    return o;
  }
  PublishResult Publish(DeltaPublisher& pub, uint32_t version) {
    model.Step(version);
    t0.FillFrom(model);
    t1.FillFrom(model);
    auto r = pub.Publish(version, Sources());
    INFO((r.ok() ? "" : std::string(r.status().message())));
    REQUIRE(r.ok());
    return *r;
  }
  // Polls `sub`, which must commit nothing and refuse one version; returns why.
  std::string RefusedOnly(DeltaSubscriber& sub) {
    PollResult r = Poll(sub);
    CHECK(r.committed.empty());
    REQUIRE(r.refused.size() == 1);
    return r.refused[0].second;
  }
  // A publisher and a subscriber on this directory, an anchor every `anchor_every` versions.
  struct Ends {
    DeltaPublisher pub;
    DeltaSubscriber sub;
  };
  Ends Open(int anchor_every) {
    return {DeltaPublisher(Options(anchor_every)), DeltaSubscriber(Options(anchor_every))};
  }
  // The trainer ranks' buffers, as a publisher takes them.
  std::vector<ShardBuffer> Sources() { return {t0.Buffer(1, 0), t1.Buffer(2, 1)}; }
  // Publishes `version`, which `sub` then commits (alone) and lands.
  PublishResult PublishLands(DeltaPublisher& pub, DeltaSubscriber& sub, uint32_t version) {
    PublishResult r = Publish(pub, version);
    REQUIRE(Poll(sub).committed == std::vector<uint64_t>{version});
    CHECK(Landed());
    return r;
  }
  PollResult Poll(DeltaSubscriber& sub) {
    return sub.Poll({i0.Buffer(11, 0), i1.Buffer(12, 1)}, hooks);
  }
  bool Landed() const { return i0.Matches(model) && i1.Matches(model); }
  std::string Path(uint64_t v, const std::string& rest) {
    return dir + "/" + VersionPrefix(v) + ".trainer-node" + rest;
  }
};

}  // namespace

TEST_CASE("an anchor then sparse deltas land bit for bit in differently sharded buffers",
          "[store]") {
  Fixture f;
  auto [pub, sub] = f.Open(4);
  CHECK(f.Poll(sub).committed.empty());  // nothing published yet

  PublishResult first = f.Publish(pub, 1);
  CHECK(first.anchor);
  CHECK(first.dense_bytes == kRows * kCols * 2);
  CHECK(f.Poll(sub).committed == std::vector<uint64_t>{1});
  CHECK(f.Landed());
  for (uint32_t v = 2; v <= 4; ++v) {
    PublishResult r = f.Publish(pub, v);
    CHECK_FALSE(r.anchor);
    CHECK(r.base_version == v - 1);
    CHECK(r.changed_elements > 0);
    CHECK(r.bytes_written * 4 < first.bytes_written);  // ~1% changed: far smaller than dense
  }
  // The subscriber was away for three versions: it applies them in order.
  CHECK(f.Poll(sub).committed == std::vector<uint64_t>{2, 3, 4});
  CHECK(f.Landed());
  CHECK(f.events == std::vector<std::string>{"begin 1", "commit 1", "begin 2", "commit 2",
                                             "begin 3", "commit 3", "begin 4", "commit 4"});

  // A delta file holds <name>.indices (global indices, delta-coded, narrowest width) and
  // <name>.values, and says what it is in its metadata.
  auto file = SafetensorsFile::Read(f.Path(3, ".0.safetensors"));
  REQUIRE(file.ok());
  CHECK(file->metadata().at("kind") == "delta");
  CHECK(file->metadata().at("base_version") == "2");
  CHECK(file->Find("w") == nullptr);
  REQUIRE(file->Find("w.indices") != nullptr);
  const std::string width = file->Find("w.indices")->dtype;  // gaps of ~100 elements
  CHECK((width == "U8" || width == "U16"));
  CHECK(file->Find("w.values")->dtype == "BF16");

  // Version 5 is an anchor again (every 4 versions).
  CHECK(f.PublishLands(pub, sub, 5).anchor);
  CHECK(sub.held_version() == 5);

  auto stale = pub.Publish(5, f.Sources());
  REQUIRE_FALSE(stale.ok());
  CHECK(stale.status().message() == "version 5 is not newer than the last published version 5");

  // A publisher restarted on the same directory keeps versions going forward, from an anchor.
  DeltaPublisher again(f.Options(4));
  REQUIRE(again.Resume().ok());
  auto old = again.Publish(3, f.Sources());
  REQUIRE_FALSE(old.ok());
  CHECK(old.status().message() == "version 3 is not newer than the last published version 5");
  CHECK(f.PublishLands(again, sub, 6).anchor);
}

TEST_CASE("a delta on another base is refused; the next anchor recovers", "[store]") {
  Fixture f;
  auto [pub, sub] = f.Open(3);
  f.PublishLands(pub, sub, 1);
  f.Publish(pub, 2);
  f.Publish(pub, 3);
  // Version 2 never arrives (its manifest is lost): version 3 builds on a base we lack.
  REQUIRE(unlink(f.Path(2, ".json").c_str()) == 0);
  const std::vector<uint16_t> before = f.i0.data;
  CHECK(f.RefusedOnly(sub) ==
        "version 3 refused: writer 'trainer-node' wrote a delta on version 2 but this agent "
        "holds version 1; waiting for the next anchor");
  CHECK(f.i0.data == before);          // nothing written
  CHECK(f.Poll(sub).refused.empty());  // not retried

  CHECK(f.PublishLands(pub, sub, 4).anchor);
}

TEST_CASE("corrupt and truncated files are refused before anything is written", "[store]") {
  Fixture f;
  auto [pub, sub] = f.Open(3);
  f.PublishLands(pub, sub, 1);
  const std::vector<uint16_t> at1 = f.i1.data;

  SECTION("a flipped byte fails the checksum") {
    f.Publish(pub, 2);
    const std::string path = f.Path(2, ".1.safetensors");
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-3, std::ios::end);
    char c = 0;
    io.read(&c, 1);
    io.seekp(-3, std::ios::end);
    c ^= 0x40;
    io.write(&c, 1);
    io.close();
    CHECK_THAT(f.RefusedOnly(sub), Catch::StartsWith("version 2 refused: " + path + ": checksum") &&
                                       Catch::Contains("(corrupted)"));
  }
  SECTION("a truncated file is named") {
    f.Publish(pub, 2);
    const std::string path = f.Path(2, ".0.safetensors");
    REQUIRE(truncate(path.c_str(), 100) == 0);
    CHECK_THAT(f.RefusedOnly(sub), Catch::Contains(path + ": 100 bytes, but the manifest says"));
  }
  CHECK(f.i1.data == at1);  // still version 1, bit for bit
  REQUIRE(f.events.size() == 3);
  CHECK(f.events[1] == "commit 1");
  // The delta on 2 cannot be used either; the anchor at 4 is.
  f.Publish(pub, 3);
  CHECK(f.RefusedOnly(sub) ==
        "version 3 refused: writer 'trainer-node' wrote a delta on version 2 but this agent holds "
        "version 1; waiting for the next anchor");
  CHECK(f.Poll(sub).refused.empty());  // said once
  CHECK(f.PublishLands(pub, sub, 4).anchor);
}

TEST_CASE("incomplete versions are not applied", "[store]") {
  Fixture f;
  StoreOptions two = f.Options(3);
  two.writers = 2;  // another agent publishes the other half of the model
  DeltaPublisher pub(f.Options(3));
  DeltaSubscriber sub(two);
  f.Publish(pub, 1);
  CHECK(f.Poll(sub).committed.empty());
  CHECK(f.events.empty());
  // Data files without their manifest are not a version either.
  DeltaSubscriber one(f.Options(3));
  REQUIRE(unlink(f.Path(1, ".json").c_str()) == 0);
  CHECK(f.Poll(one).committed.empty());
  CHECK(f.events.empty());
}

TEST_CASE("a destination of another dtype or a tensor not published is named", "[store]") {
  Fixture f;
  auto [pub, sub] = f.Open(3);
  f.Publish(pub, 1);
  std::vector<uint8_t> f16(kRows * kCols * 2);
  auto f16_spec = Spec("w", v1::DTYPE_F16, {});
  PollResult r = sub.Poll({ShardBuffer{f16_spec, 0, absl::MakeSpan(f16), 21}}, f.hooks);
  REQUIRE(r.refused.size() == 1);
  CHECK(r.refused[0].second ==
        "version 1 refused: destination tensor 'w' (rank 0) is F16 but version 1 stores it "
        "as BF16; the storage path applies only the same dtype");
  std::vector<uint8_t> fp8(kRows * kCols);
  DeltaSubscriber no_scale(f.Options(3));
  r = no_scale.Poll({ShardBuffer{Spec("w", v1::DTYPE_F8_E4M3, {}), 0, absl::MakeSpan(fp8), 23}},
                    f.hooks);
  REQUIRE(r.refused.size() == 1);
  CHECK(r.refused[0].second ==
        "version 1 refused: FP8 destination tensor 'w' (rank 0) has no F32 scale tensor "
        "'w_scale_inv' registered by its owner");
  f.Publish(pub, 2);
  f.Publish(pub, 3);
  auto other = Spec("v", v1::DTYPE_BF16, {});
  std::vector<uint8_t> buf(kRows * kCols * 2);
  DeltaSubscriber fresh(f.Options(3));
  f.Publish(pub, 4);
  r = fresh.Poll({ShardBuffer{other, 0, absl::MakeSpan(buf), 22}}, f.hooks);
  REQUIRE(r.refused.size() == 1);
  CHECK(r.refused[0].second ==
        "version 4 refused: destination tensor 'v' (rank 0): version 4 has no tensor of that name");
}

TEST_CASE("old versions are pruned: the previous anchor and what follows stay", "[store]") {
  Fixture f;
  DeltaPublisher pub(f.Options(2));
  for (uint32_t v = 1; v <= 5; ++v) f.Publish(pub, v);  // anchors at 1, 3, 5
  CHECK(access(f.Path(1, ".json").c_str(), F_OK) != 0);
  CHECK(access(f.Path(2, ".0.safetensors").c_str(), F_OK) != 0);
  CHECK(access(f.Path(3, ".json").c_str(), F_OK) == 0);
  CHECK(access(f.Path(4, ".1.safetensors").c_str(), F_OK) == 0);
  // A subscriber starting now seeks the newest anchor.
  DeltaSubscriber sub(f.Options(2));
  CHECK(f.Poll(sub).committed == std::vector<uint64_t>{5});
  CHECK(f.Landed());
}

TEST_CASE("a destination registered later catches up quietly; deltas keep flowing", "[store]") {
  Fixture f;
  auto [pub, sub] = f.Open(8);
  for (uint32_t v = 1; v <= 3; ++v) {
    f.Publish(pub, v);
    CHECK(sub.Poll({f.i0.Buffer(11, 0)}, f.hooks).committed == std::vector<uint64_t>{v});
  }
  CHECK(f.i0.Matches(f.model));
  CHECK_FALSE(f.i1.Matches(f.model));
  const size_t events = f.events.size();
  // Rank 1 registers now: it is brought to version 3 (anchor 1, deltas 2 and 3) with no event.
  PollResult r = f.Poll(sub);
  CHECK(r.committed.empty());
  CHECK(r.refused.empty());
  CHECK(f.events.size() == events);
  CHECK(f.Landed());
  // The next delta applies to both.
  CHECK_FALSE(f.Publish(pub, 4).anchor);
  CHECK(f.Poll(sub).committed == std::vector<uint64_t>{4});
  CHECK(f.Landed());
}

TEST_CASE("FP8 destinations are quantised from a BF16 copy that deltas keep current", "[store]") {
  Fixture f;
  auto [pub, sub] = f.Open(8);
  // 64 x 48 is one (partial) 128 x 128 block: one float32 scale.
  std::vector<uint8_t> q(kRows * kCols);
  float scale = 0;
  const v1::TensorSpec scale_spec = WholeSpec("w_scale_inv", v1::DTYPE_F32, {1, 1});
  const std::vector<ShardBuffer> dests = {
      {Spec("w", v1::DTYPE_F8_E4M3, {}), 0, absl::MakeSpan(q), 41},
      {scale_spec, 0, absl::MakeSpan(reinterpret_cast<uint8_t*>(&scale), 4), 42}};
  transform::TransformDesc desc{transform::Kind::kFp8Block, transform::DType::kBF16,
                                transform::DType::kF8E4M3, kRows, kCols};
  for (uint32_t v = 1; v <= 4; ++v) {
    CHECK(f.Publish(pub, v).anchor == (v == 1));
    CHECK(sub.Poll(dests, f.hooks).committed == std::vector<uint64_t>{v});
    std::vector<uint8_t> want(kRows * kCols);
    float want_scale = 0;
    REQUIRE(transform::ValidateDesc(desc).ok());
    REQUIRE(transform::ApplyTransformCpu(desc, f.model.full.data(), want.data(), &want_scale).ok());
    CHECK(q == want);
    CHECK(scale == want_scale);
  }
}

TEST_CASE("a fused destination (qkv_proj) takes its parts' anchors and deltas", "[store]") {
  const std::string dir = wb::testing::TempDir("wb-store-");
  StoreOptions o;
  o.dir = dir;
  o.writer = "t";
  o.anchor_every = 8;
  DeltaPublisher pub(o);
  DeltaSubscriber sub(o);
  // Parts of 32, 16 and 16 rows of 48; each split over two trainer ranks by rows.
  const std::vector<std::pair<std::string, int64_t>> parts = {
      {"l.q_proj.weight", 32}, {"l.k_proj.weight", 16}, {"l.v_proj.weight", 16}};
  std::vector<std::vector<uint16_t>> full;
  std::mt19937 rng(3);
  for (const auto& [name, rows] : parts) {
    full.emplace_back(rows * 48);
    for (auto& x : full.back()) x = static_cast<uint16_t>(rng());
  }
  auto part_spec = [&](size_t p, int rank) {
    v1::TensorSpec s;
    s.set_name(parts[p].first);
    s.set_dtype(v1::DTYPE_BF16);
    s.add_global_shape(parts[p].second);
    s.add_global_shape(48);
    auto* r = s.add_shard();
    r->set_start(rank * parts[p].second / 2);
    r->set_size(parts[p].second / 2);
    s.add_shard()->set_size(48);
    return s;
  };
  // The fused destination, column halves: [64, 24) per rank.
  std::vector<std::vector<uint16_t>> dst(2, std::vector<uint16_t>(64 * 24));
  std::vector<ShardBuffer> dests;
  for (int rank = 0; rank < 2; ++rank) {
    v1::TensorSpec s;
    s.set_name("l.qkv_proj.weight");
    s.set_dtype(v1::DTYPE_BF16);
    s.add_global_shape(64);
    s.add_global_shape(48);
    s.add_shard()->set_size(64);
    auto* c = s.add_shard();
    c->set_start(rank * 24);
    c->set_size(24);
    dests.push_back({s, rank,
                     absl::MakeSpan(reinterpret_cast<uint8_t*>(dst[rank].data()), 64 * 24 * 2),
                     uint64_t(50 + rank)});
  }
  for (uint32_t v = 1; v <= 3; ++v) {
    for (auto& t : full) {
      for (int k = 0; k < 8; ++k) t[rng() % t.size()] ^= 0x10;
    }
    std::vector<ShardBuffer> srcs;
    for (size_t p = 0; p < parts.size(); ++p) {
      for (int rank = 0; rank < 2; ++rank) {
        const size_t half = full[p].size() / 2;
        srcs.push_back(
            {part_spec(p, rank), rank,
             absl::MakeSpan(reinterpret_cast<uint8_t*>(full[p].data() + rank * half), half * 2),
             uint64_t(10 + p * 2 + rank)});
      }
    }
    auto r = pub.Publish(v, srcs);
    REQUIRE(r.ok());
    CHECK(r->anchor == (v == 1));
    PollResult applied = sub.Poll(dests, {});
    INFO((applied.refused.empty() ? "" : applied.refused[0].second));
    REQUIRE(applied.committed == std::vector<uint64_t>{v});
    // Row i of qkv is row i of q, then of k, then of v.
    bool same = true;
    int64_t row = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      for (int64_t i = 0; i < parts[p].second; ++i, ++row) {
        for (int64_t c = 0; c < 48; ++c) {
          same &= dst[c / 24][row * 24 + c % 24] == full[p][i * 48 + c];
        }
      }
    }
    CHECK(same);
  }
}

TEST_CASE("configured renames and fusions map stored names to destinations", "[store]") {
  const std::string dir = wb::testing::TempDir("wb-store-");
  StoreOptions o;
  o.dir = dir;
  o.writer = "t";
  DeltaPublisher pub(o);
  // The trainer publishes trainer.a and trainer.b (32 rows of 48 each); the engine holds the
  // fused ab = a ++ b along rows.
  std::vector<std::vector<uint16_t>> full(2, std::vector<uint16_t>(32 * 48));
  std::mt19937 rng(5);
  for (auto& t : full) {
    for (auto& x : t) x = static_cast<uint16_t>(rng());
  }
  std::vector<ShardBuffer> srcs;
  for (int p = 0; p < 2; ++p) {
    v1::TensorSpec s;
    s.set_name(p == 0 ? "trainer.a" : "trainer.b");
    s.set_dtype(v1::DTYPE_BF16);
    s.add_global_shape(32);
    s.add_global_shape(48);
    srcs.push_back({s, 0, absl::MakeSpan(reinterpret_cast<uint8_t*>(full[p].data()), 32 * 48 * 2),
                    uint64_t(1 + p)});
  }
  REQUIRE(pub.Publish(1, srcs).ok());
  std::vector<uint16_t> dst(64 * 48);
  const v1::TensorSpec ds = WholeSpec("ab", v1::DTYPE_BF16, {64, 48});
  const std::vector<ShardBuffer> dests = {
      {ds, 0, absl::MakeSpan(reinterpret_cast<uint8_t*>(dst.data()), dst.size() * 2), 9}};

  DeltaSubscriber plain(o);  // the default rules know neither name
  PollResult refused = plain.Poll(dests, {});
  REQUIRE(refused.refused.size() == 1);
  CHECK(refused.refused[0].second ==
        "version 1 refused: destination tensor 'ab' (rank 0): version 1 has no tensor of that "
        "name");

  o.renames = {{R"(trainer\.(.*))", R"(\1)"}};
  o.fusions = {{"ab", {"a", "b"}, 0}};
  DeltaSubscriber configured(o);
  PollResult applied = configured.Poll(dests, {});
  INFO((applied.refused.empty() ? "" : applied.refused[0].second));
  REQUIRE(applied.committed == std::vector<uint64_t>{1});
  std::vector<uint16_t> want = full[0];
  want.insert(want.end(), full[1].begin(), full[1].end());
  CHECK(dst == want);
}

}  // namespace wb::storage
