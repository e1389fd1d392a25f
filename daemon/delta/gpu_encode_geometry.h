// Launch geometry of the GPU delta encoder and the GPU scatter: plain constexpr arithmetic,
// shared by the .cu files and the host tests that check it without a GPU.
#pragma once

#include <cstdint>
#include <string>

namespace wb::delta::gpu_geometry {

// Count and write kernels: each thread compares kUnitsPerThread 16-byte units (several loads
// in flight before the first use), a block covers one tile.
constexpr int kThreads = 256;
constexpr uint64_t kUnitBytes = 16;
constexpr int kUnitsPerThread = 4;
constexpr uint64_t kUnitsPerTile = uint64_t{kThreads} * kUnitsPerThread;
constexpr uint64_t kTileBytes = kUnitsPerTile * kUnitBytes;  // 16 KiB
// The tile scan runs as one block; each thread walks a contiguous run of tiles.
constexpr int kScanThreads = 1024;
// gridDim.x limit: 2^31 - 1 tiles, i.e. buffers below 32 TiB.
constexpr uint64_t kMaxTiles = (uint64_t{1} << 31) - 1;

// Per-tile scratch: the count kernel's summary (count, first, last + 1, max gap) and the scan's
// output (record offset, last + 1 before the tile).
constexpr uint64_t kSummaryBytes = 4 * sizeof(uint64_t);
constexpr uint64_t kScanBytes = 2 * sizeof(uint64_t);

constexpr uint64_t TileCount(uint64_t bytes) { return (bytes + kTileBytes - 1) / kTileBytes; }
constexpr uint64_t TilesPerScanThread(uint64_t tiles) {
  return (tiles + kScanThreads - 1) / kScanThreads;
}
// Device scratch for one encode of `bytes` bytes (the records go to separate buffers).
// Per tile a summary and a scan entry, then the totals (count, largest gap) and the write
// pass's check (records written, tiles that disagree with the count pass).
constexpr uint64_t EncodeScratchBytes(uint64_t bytes) {
  return TileCount(bytes) * (kSummaryBytes + kScanBytes) + 4 * sizeof(uint64_t);
}

// The write pass against the count pass. `counted`: records the count pass found (the gap and
// value buffers hold exactly that many; the kernel never stores past them). `written`: records
// the write pass found. `moved_tiles`: tiles whose changes (count, first or last) differ from
// the count pass's, or whose gaps no longer fit the index width. They agree only when the source
// did not change between the passes; else the encoding is torn and the op must fail. Returns ""
// when they agree, else the error (the .cu file's, host-tested).
inline std::string WritePassError(uint64_t counted, uint64_t written, uint64_t moved_tiles) {
  if (counted == written && moved_tiles == 0) return "";
  return "the source changed while it was being encoded (count pass: " + std::to_string(counted) +
         " changes, write pass: " + std::to_string(written) + ", " + std::to_string(moved_tiles) +
         " tiles moved); the trainer must not write a step's sources until they have been read "
         "(docs/clients.md)";
}

constexpr int ElemsPerUnit(int elem_size) { return static_cast<int>(kUnitBytes) / elem_size; }

// The scatter kernel: a grid-stride loop over records, at most 65535 blocks of 256 threads.
constexpr int kScatterThreads = 256;
constexpr int kMaxScatterBlocks = 65535;
constexpr int ScatterBlocks(uint64_t count) {
  const uint64_t needed = (count + kScatterThreads - 1) / kScatterThreads;
  return static_cast<int>(needed < kMaxScatterBlocks ? (needed == 0 ? 1 : needed)
                                                     : kMaxScatterBlocks);
}

}  // namespace wb::delta::gpu_geometry
