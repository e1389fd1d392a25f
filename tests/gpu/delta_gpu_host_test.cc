// The code around the GPU delta kernels, without a GPU: launch geometry, the packed header
// both encoders share, argument errors (checked before any CUDA call) and the message when no
// device or no toolkit is there.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "daemon/delta/delta_codec.h"
#include "daemon/delta/gpu_encode_geometry.h"
#include "daemon/delta/gpu_encoder.h"

namespace wb::delta {
namespace {

namespace g = gpu_geometry;

TEST_CASE("encode geometry: 16 KiB tiles, scratch per tile, grid limits", "[gpu][geometry]") {
  CHECK(g::kTileBytes == 16384);
  CHECK(g::kTileBytes == g::kThreads * g::kUnitsPerThread * g::kUnitBytes);
  CHECK(g::TileCount(0) == 0);
  CHECK(g::TileCount(1) == 1);
  CHECK(g::TileCount(16384) == 1);
  CHECK(g::TileCount(16385) == 2);
  CHECK(g::TileCount(uint64_t{1} << 30) == 65536);
  // A 1 GiB buffer: 65536 tiles, 64 per scan thread, 3 MiB of scratch.
  CHECK(g::TilesPerScanThread(65536) == 64);
  CHECK(g::TilesPerScanThread(1) == 1);
  // + totals (count, largest gap) and the write pass's check (written, moved tiles).
  CHECK(g::EncodeScratchBytes(uint64_t{1} << 30) == 65536 * 48 + 32);
  CHECK(g::TileCount(uint64_t{32} << 40) > g::kMaxTiles);  // 32 TiB: refused, not wrapped
  CHECK(g::ElemsPerUnit(1) == 16);
  CHECK(g::ElemsPerUnit(2) == 8);
  CHECK(g::ElemsPerUnit(4) == 4);
}

TEST_CASE("the write pass fails the op when it disagrees with the count pass", "[gpu][geometry]") {
  CHECK(g::WritePassError(0, 0, 0).empty());
  CHECK(g::WritePassError(1000, 1000, 0).empty());
  // More changes found than the buffers were sized for (the kernel stored only 1000).
  const std::string more = g::WritePassError(1000, 1500, 3);
  CHECK(more.find("count pass: 1000 changes, write pass: 1500") != std::string::npos);
  CHECK(more.find("source changed") != std::string::npos);
  // Fewer: the buffers hold stale bytes past the last record.
  CHECK(!g::WritePassError(1000, 10, 1).empty());
  // The same total, but changes moved between tiles (or a gap outgrew the index width): the
  // records' positions are wrong even though no buffer overflowed.
  CHECK(g::WritePassError(1000, 1000, 2).find("2 tiles moved") != std::string::npos);
}

TEST_CASE("scatter geometry: at least one block, at most 65535", "[gpu][geometry]") {
  CHECK(g::ScatterBlocks(0) == 1);
  CHECK(g::ScatterBlocks(1) == 1);
  CHECK(g::ScatterBlocks(256) == 1);
  CHECK(g::ScatterBlocks(257) == 2);
  CHECK(g::ScatterBlocks(uint64_t{256} * 65535) == 65535);
  CHECK(g::ScatterBlocks(uint64_t{1} << 40) == 65535);
}

TEST_CASE("the shared header helpers write what ParseDeltaHeader reads", "[gpu][format]") {
  CHECK(DeltaIndexWidth(0) == 1);
  CHECK(DeltaIndexWidth(255) == 1);
  CHECK(DeltaIndexWidth(256) == 2);
  CHECK(DeltaIndexWidth(65536) == 4);
  CHECK(DeltaIndexWidth(uint64_t{1} << 32) == 8);
  DeltaHeader h{2, 4, 1000, 3};
  std::vector<uint8_t> packed(PackedDeltaBytes(h), 0);
  CHECK(packed.size() == kDeltaHeaderBytes + 3 * 6);
  WriteDeltaHeader(h, packed.data());
  auto parsed = ParseDeltaHeader(packed);
  REQUIRE(parsed.ok());
  CHECK(parsed->elem_size == 2);
  CHECK(parsed->index_width == 4);
  CHECK(parsed->total_elems == 1000);
  CHECK(parsed->count == 3);
}

TEST_CASE("the CPU codec's packed header is the shared one", "[gpu][format]") {
  std::vector<uint8_t> shadow(4096, 0), next(4096, 0);
  next[100] = 1;
  auto enc = EncodeDelta(absl::MakeSpan(shadow), next, 2);
  REQUIRE(enc.ok());
  REQUIRE(enc->kind == DeltaEncoding::Kind::kPacked);
  std::vector<uint8_t> header(kDeltaHeaderBytes);
  WriteDeltaHeader({2, 1, 2048, 1}, header.data());
  CHECK(std::vector<uint8_t>(enc->packed.begin(), enc->packed.begin() + kDeltaHeaderBytes) ==
        header);
}

TEST_CASE("the GPU encoder refuses bad arguments as the CPU codec does", "[gpu]") {
  GpuDeltaEncoder encoder(0);
  GpuShadow empty;  // no allocation: the checks come first
  auto bad_elem = encoder.Encode(empty, nullptr, 0, 3);
  CHECK(absl::IsInvalidArgument(bad_elem.status()));
  CHECK(bad_elem.status().message() == "delta: element size 3 is not 1, 2 or 4 bytes");
  auto bad_size = encoder.Encode(empty, nullptr, 64, 2);
  CHECK(bad_size.status().message() == "delta: shadow has 0 bytes but the new version 64");
}

TEST_CASE("without a device the GPU encoder says why", "[gpu]") {
  if (GpuEncodeAvailable().ok()) return;  // a GPU host: delta_gpu_encode_test covers it
  const std::string why(GpuEncodeAvailable().message());
  INFO(why);
  CHECK((why == "built without CUDA" || why.rfind("no CUDA device", 0) == 0));
  GpuDeltaEncoder encoder(0);
  auto shadow = GpuShadow::Allocate(encoder.device_encoder(), 4096, ShadowPlacement::kDevice);
  CHECK_FALSE(shadow.ok());
  CHECK_THAT(std::string(shadow.status().message()), Catch::Contains("cuda:0"));
}

}  // namespace
}  // namespace wb::delta
