// Device-free tests of the rdma backend: GID selection from a fake sysfs tree, chunk planning
// across rails and queue pairs, the batch-size immediate, and probing without devices.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "daemon/transport/rdma/chunk_plan.h"
#include "daemon/transport/rdma/gid.h"
#include "daemon/transport/rdma/handshake.h"
#include "daemon/transport/rdma/landing_notice.h"
#include "daemon/transport/rdma/rdma_peer.h"
#include "daemon/transport/rdma/rdma_transport.h"
#include "daemon/transport/rdma/verbs.h"
#include "weightbeam/v1/transport.pb.h"

namespace fs = std::filesystem;
using namespace wb::transport;
using namespace wb::transport::rdma;

namespace {

void WriteFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// A fake /sys/class/infiniband with one device whose GID table is given as (type, gid) rows.
fs::path FakeSysfs(const std::vector<std::pair<std::string, std::string>>& table) {
  fs::path root = fs::temp_directory_path() /
                  ("wb_sysfs_" + std::to_string(getpid()) + "_" + std::to_string(rand()));
  fs::path port = root / "mlx5_0" / "ports" / "1";
  for (size_t i = 0; i < table.size(); ++i) {
    if (!table[i].first.empty())
      WriteFile(port / "gid_attrs" / "types" / std::to_string(i), table[i].first);
    WriteFile(port / "gids" / std::to_string(i), table[i].second);
  }
  return root;
}

}  // namespace

TEST_CASE("GID selection picks the first RoCE v2 entry with an IPv4-mapped GID") {
  fs::path root = FakeSysfs({
      {"IB/RoCE v1", "fe80:0000:0000:0000:d868:66ff:fe44:cd4c"},
      {"RoCE v2", "fe80:0000:0000:0000:d868:66ff:fe44:cd4c"},
      {"IB/RoCE v1", "0000:0000:0000:0000:0000:ffff:0a4d:0001"},
      {"RoCE v2", "0000:0000:0000:0000:0000:ffff:0a4d:0001"},
      {"RoCE v2", "0000:0000:0000:0000:0000:ffff:c0a8:0102"},
  });
  absl::StatusOr<GidChoice> gid = FindRoceV2Ipv4Gid(root.string(), "mlx5_0", 1);
  REQUIRE(gid.ok());
  CHECK(gid->index == 3);
  CHECK(gid->ipv4 == "10.77.0.1");
  fs::remove_all(root);
}

TEST_CASE("GID selection names the device when no entry qualifies") {
  fs::path root = FakeSysfs({
      {"RoCE v2", "fe80:0000:0000:0000:d868:66ff:fe44:cd4c"},
      {"", "0000:0000:0000:0000:0000:0000:0000:0000"},  // unused entry: no type file
  });
  absl::StatusOr<GidChoice> gid = FindRoceV2Ipv4Gid(root.string(), "mlx5_0", 1);
  REQUIRE_FALSE(gid.ok());
  CHECK(gid.status().message() ==
        "no RoCE v2 GID with an IPv4 address on mlx5_0 port 1 (is the netdev up with an IPv4 "
        "address?)");
  CHECK_FALSE(FindRoceV2Ipv4Gid(root.string(), "mlx5_9", 1).ok());
  fs::remove_all(root);
}

TEST_CASE("IPv4-mapped GIDs are recognised") {
  CHECK(Ipv4FromGid("0000:0000:0000:0000:0000:ffff:c0a8:0102") == "192.168.1.2");
  CHECK(Ipv4FromGid("fe80:0000:0000:0000:d868:66ff:fe44:cd4c").empty());
  CHECK(Ipv4FromGid("garbage").empty());
}

TEST_CASE("a large write is split across every rail, in chunks no longer than chunk_bytes") {
  ChunkPlanOptions options;
  options.rails = 2;
  options.qps_per_rail = 2;
  options.chunk_bytes = 1 << 20;
  std::vector<WriteOp> ops = {{1, 100, 2, 5000, (uint64_t{5} << 20) + 123}};
  std::vector<Chunk> chunks = PlanChunks(ops, options);
  std::map<int, uint64_t> per_rail;
  std::map<std::pair<int, int>, int> per_qp;
  uint64_t next_local = 100, next_remote = 5000, total = 0;
  for (const Chunk& c : chunks) {
    CHECK(c.length <= options.chunk_bytes);
    CHECK(c.local_offset == next_local);  // contiguous, in order, nothing lost or doubled
    CHECK(c.remote_offset == next_remote);
    CHECK(c.local_region == 1);
    CHECK(c.remote_region == 2);
    next_local += c.length;
    next_remote += c.length;
    total += c.length;
    per_rail[c.rail] += c.length;
    per_qp[{c.rail, c.qp}]++;
  }
  CHECK(total == ops[0].length);
  REQUIRE(per_rail.size() == 2);
  CHECK(per_rail[0] > (uint64_t{2} << 20));
  CHECK(per_rail[1] > (uint64_t{2} << 20));
  CHECK(per_qp.size() == 4);  // both queue pairs of both rails carry work
}

TEST_CASE("small writes go whole to one rail, alternating, and empty writes vanish") {
  ChunkPlanOptions options;
  options.rails = 2;
  std::vector<WriteOp> ops = {{1, 0, 2, 0, 4096}, {1, 4096, 2, 4096, 0}, {1, 8192, 2, 8192, 100}};
  std::vector<Chunk> chunks = PlanChunks(ops, options);
  REQUIRE(chunks.size() == 2);
  CHECK(chunks[0].rail == 0);
  CHECK(chunks[0].length == 4096);
  CHECK(chunks[1].rail == 1);
  CHECK(chunks[1].local_offset == 8192);
}

TEST_CASE("chunk lengths stay below 2^32 even when chunk_bytes is huge") {
  ChunkPlanOptions options;
  options.chunk_bytes = uint64_t{1} << 40;
  std::vector<Chunk> chunks = PlanChunks({{1, 0, 2, 0, uint64_t{5} << 30}}, options);
  for (const Chunk& c : chunks) CHECK(c.length <= (uint64_t{1} << 30));
  CHECK(chunks.size() == 5);
}

TEST_CASE("the batch-size immediate is exact below 2 GiB and KiB-rounded above") {
  CHECK(DecodeBatchBytes(EncodeBatchBytes(0)) == 0);
  CHECK(DecodeBatchBytes(EncodeBatchBytes(12345)) == 12345);
  CHECK(DecodeBatchBytes(EncodeBatchBytes((uint64_t{1} << 31) - 1)) == (uint64_t{1} << 31) - 1);
  CHECK(DecodeBatchBytes(EncodeBatchBytes(uint64_t{3} << 30)) == uint64_t{3} << 30);
  CHECK(DecodeBatchBytes(EncodeBatchBytes((uint64_t{3} << 30) + 1)) == (uint64_t{3} << 30) + 1024);
}

TEST_CASE("a configured device that does not exist makes the transport unavailable") {
  wb::config::RdmaTransportConfig config;
  config.devices = {"wb_no_such_nic"};
  auto transport = RdmaTransport::Create(config);
  REQUIRE_FALSE(transport.ok());
  CHECK(transport.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(transport.status().message()),
             Catch::StartsWith("not available: rdma device wb_no_such_nic: RDMA device "
                               "'wb_no_such_nic' not found"));
}

TEST_CASE("without RDMA devices the transport says so instead of crashing") {
  if (!ListDevices().empty()) {
    WARN("this host has RDMA devices; the no-device message is checked on hosts without");
    return;
  }
  auto transport = RdmaTransport::Create(wb::config::RdmaTransportConfig{});
  REQUIRE_FALSE(transport.ok());
  CHECK(transport.status().code() == absl::StatusCode::kUnavailable);
  CHECK(transport.status().message() == "not available: no RDMA device found");
}

TEST_CASE("landing notices: ranges merge per step, encode into slots and assemble back") {
  std::vector<LandedRange> merged = MergeRanges(
      {{7, 1000, 100}, {7, 1100, 50}, {7, 900, 10}, {8, 1000, 10}, {7, 0, 0}, {7, 1120, 100}});
  CHECK(merged == std::vector<LandedRange>{{7, 900, 10}, {7, 1000, 220}, {8, 1000, 10}});

  std::vector<LandedRange> ranges;
  for (uint64_t i = 0; i < 10; ++i) ranges.push_back({3, 4096 * i, 100 + i});
  // 24-byte header and 24-byte entries: 4 entries per 120-byte slot, so 3 notices.
  auto notices = EncodeNotices(42, ranges, 120);
  REQUIRE(notices.ok());
  REQUIRE(notices->size() == 3);
  for (const std::string& n : *notices) CHECK(n.size() <= 120);
  NoticeAssembler a;
  // In any order: the immediate closes the set once every notice of the batch is in.
  REQUIRE(a.Add((*notices)[2].data(), (*notices)[2].size()).ok());
  REQUIRE(a.Add((*notices)[0].data(), (*notices)[0].size()).ok());
  CHECK_FALSE(a.Close().ok());  // notice 1 missing: nothing is reported
  for (const std::string& n : *notices) REQUIRE(a.Add(n.data(), n.size()).ok());
  auto closed = a.Close();
  REQUIRE(closed.ok());
  std::vector<LandedRange> got = *closed;
  std::sort(got.begin(), got.end(),
            [](const LandedRange& x, const LandedRange& y) { return x.addr < y.addr; });
  CHECK(got == ranges);
  // Closed: a second immediate without notices reports nothing (NOT_FOUND: a sender without
  // landing notices, not a malformed set).
  CHECK(absl::IsNotFound(a.Close().status()));

  // An empty batch still sends one notice, with no entries.
  auto empty = EncodeNotices(43, {}, 2048);
  REQUIRE(empty.ok());
  REQUIRE(empty->size() == 1);
  REQUIRE(a.Add((*empty)[0].data(), (*empty)[0].size()).ok());
  auto none = a.Close();
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("landing notices: a batch whose immediate never came is dropped by the next one") {
  auto first = EncodeNotices(1, {{5, 0, 10}, {5, 100, 10}}, 48);  // one entry each: two notices
  auto second = EncodeNotices(2, {{5, 200, 10}}, 2048);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  REQUIRE(first->size() == 2);
  NoticeAssembler a;
  REQUIRE(a.Add((*first)[0].data(), (*first)[0].size()).ok());
  // Batch 1 timed out before its other notice and immediate went out; batch 2 follows.
  REQUIRE(a.Add((*second)[0].data(), (*second)[0].size()).ok());
  auto closed = a.Close();
  REQUIRE(closed.ok());
  CHECK(*closed == std::vector<LandedRange>{{5, 200, 10}});
}

TEST_CASE("landing notices: malformed or lying notices are refused and change nothing") {
  auto good = EncodeNotices(9, {{1, 64, 64}}, 2048);
  REQUIRE(good.ok());
  const std::string n = (*good)[0];
  NoticeAssembler a;
  CHECK_FALSE(a.Add(n.data(), 10).ok());            // shorter than the header
  CHECK_FALSE(a.Add(n.data(), n.size() - 1).ok());  // entries do not match the size
  std::string longer = n + std::string(24, '\0');   // one more entry than it says
  CHECK_FALSE(a.Add(longer.data(), longer.size()).ok());
  std::string magic = n;
  magic[0] ^= 1;
  CHECK_FALSE(a.Add(magic.data(), magic.size()).ok());
  std::string index = n;
  index[8] = 5;  // index 5 of count 1
  CHECK_FALSE(a.Add(index.data(), index.size()).ok());
  std::string zero = n;
  zero[10] = 0;  // count 0
  CHECK_FALSE(a.Add(zero.data(), zero.size()).ok());
  std::string wrap = n;
  for (int i = 0; i < 8; ++i) wrap[24 + 8 + i] = static_cast<char>(0xff);  // address near 2^64
  CHECK_FALSE(a.Add(wrap.data(), wrap.size()).ok());
  std::string empty_range = n;
  for (int i = 0; i < 8; ++i) empty_range[24 + 16 + i] = 0;  // length 0
  CHECK_FALSE(a.Add(empty_range.data(), empty_range.size()).ok());
  CHECK(absl::IsNotFound(a.Close().status()));  // none of those was kept
  // A duplicate notice spoils its batch: nothing is reported for it.
  REQUIRE(a.Add(n.data(), n.size()).ok());
  CHECK_FALSE(a.Add(n.data(), n.size()).ok());
  CHECK_FALSE(a.Close().ok());
  // Random bytes never crash it.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string junk = n;
    junk.resize(rng() % 128);
    for (char& c : junk) c = static_cast<char>(rng());
    if (rng() % 2 && junk.size() >= 4) std::memcpy(junk.data(), n.data(), 4);
    (void)a.Add(junk.data(), junk.size());
  }
  (void)a.Close();
}

TEST_CASE("landing notices: a batch carrying more ranges than the bound is refused whole") {
  // The sender never encodes more than the bound.
  std::vector<LandedRange> many;
  for (uint64_t i = 0; i <= kMaxLandedRangesPerBatch; ++i) many.push_back({1, 64 * i, 8});
  CHECK(absl::IsResourceExhausted(EncodeNotices(1, many, 1 << 16).status()));
  many.pop_back();
  REQUIRE(EncodeNotices(1, many, 1 << 16).ok());

  // A peer that does, with notices each valid on its own: 2,729 + 1,367 ranges (the bound
  // exactly) in two 64 KiB notices, then a third.
  auto first = EncodeNotices(5, many, 1 << 16);
  REQUIRE(first.ok());
  REQUIRE(first->size() == 2);
  std::string extra = (*first)[1];  // the second notice again, renumbered as a third
  extra[8] = 2;
  for (std::string* n : {&(*first)[0], &(*first)[1], &extra}) (*n)[10] = 3;  // count 3
  NoticeAssembler a;
  REQUIRE(a.Add((*first)[0].data(), (*first)[0].size()).ok());
  REQUIRE(a.Add((*first)[1].data(), (*first)[1].size()).ok());  // 4,096: at the bound
  CHECK_FALSE(a.Add(extra.data(), extra.size()).ok());          // 5,463: over it
  CHECK_FALSE(a.Close().ok());                                  // nothing of batch 5 is reported
  // A count beyond the bound is refused at once.
  std::string huge = (*first)[0];
  huge[10] = static_cast<char>(0xff);
  huge[11] = static_cast<char>(0xff);
  CHECK_FALSE(a.Add(huge.data(), huge.size()).ok());
  // The next honest batch lands as usual.
  auto next = EncodeNotices(6, {{2, 128, 64}}, 2048);
  REQUIRE(next.ok());
  REQUIRE(a.Add((*next)[0].data(), (*next)[0].size()).ok());
  auto closed = a.Close();
  REQUIRE(closed.ok());
  CHECK(*closed == std::vector<LandedRange>{{2, 128, 64}});
}

TEST_CASE("a batch of more writes than a receiver takes ranges for goes as several") {
  std::vector<WriteOp> ops;
  for (uint64_t i = 0; i < 2 * kMaxLandedRangesPerBatch + 5; ++i) {
    ops.push_back({1, 16 * i, 2, 32 * i, 16});  // a strided op: one write per row
  }
  auto parts = SplitBatch(ops, kMaxLandedRangesPerBatch);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].size() == kMaxLandedRangesPerBatch);
  CHECK(parts[2].size() == 5);
  uint64_t next = 0;  // every write once, in order
  for (const auto& part : parts) {
    for (const WriteOp& w : part) CHECK(w.remote_offset == 32 * next++);
  }
  CHECK(next == ops.size());
  CHECK(SplitBatch(std::vector<WriteOp>(3), kMaxLandedRangesPerBatch).size() == 1);

  // The batch is done once every part is, with the first failure.
  int calls = 0;
  absl::Status got;
  BatchDone joined = JoinDone(3, [&](absl::Status s) {
    ++calls;
    got = s;
  });
  joined(absl::OkStatus());
  joined(absl::DeadlineExceededError("part 2"));
  CHECK(calls == 0);
  joined(absl::UnavailableError("part 3"));
  CHECK(calls == 1);
  CHECK(absl::IsDeadlineExceeded(got));
}

TEST_CASE("the rdma handshake announces the landing-notice buffers; an older record says none") {
  QpEndpoint ep;
  ep.device = "mlx5_0";
  ep.qpn = 17;
  uint32_t notice_bytes = 99;
  auto parsed = ParseHandshake("peer", SerializeHandshake("me", {ep}, 2048), &notice_bytes);
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 1);
  CHECK((*parsed)[0].qpn == 17);
  CHECK(notice_bytes == 2048);
  // An agent built before landing notices leaves the field out: it takes none.
  weightbeam::v1::RdmaHandshake old;
  old.set_from_agent("old");
  old.add_qps()->set_gid(std::string(16, '\0'));
  REQUIRE(ParseHandshake("old", old.SerializeAsString(), &notice_bytes).ok());
  CHECK(notice_bytes == 0);
}
