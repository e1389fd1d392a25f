// CUDA delta encoder: three kernels on a stream of its own.
//   CountTiles   one block per 16 KiB tile: changed elements, first and last index, largest
//                gap inside the tile (16-byte loads, four in flight per thread)
//   ScanTiles    one block: each tile's first record number and the last change before it,
//                the total count and the largest gap overall (which fixes the index width)
//   WriteRecords one block per tile with changes: gaps at the chosen width and values in
//                record order, and the changed 16-byte units copied into the shadow
// Records come out exactly as the CPU codec writes them (delta_codec.h): gap 0 counts from
// index 0, later gaps from the previous change.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common/gpu/device_health.h"
#include "daemon/delta/gpu_encode.h"
#include "daemon/delta/gpu_encode_geometry.h"

namespace wb::delta::cuda {
namespace {

namespace g = gpu_geometry;

// "Last change + 1" is kept instead of the index itself so that 0 can mean "no change yet".
struct TileSummary {
  uint64_t count;
  uint64_t first;
  uint64_t last_plus1;
  uint64_t max_gap;
};
static_assert(sizeof(TileSummary) == g::kSummaryBytes, "geometry and kernels disagree");
struct TileScan {
  uint64_t offset;      // record number of the tile's first change
  uint64_t last_plus1;  // last change before the tile, + 1 (0: none)
};
static_assert(sizeof(TileScan) == g::kScanBytes, "geometry and kernels disagree");
struct Totals {
  uint64_t count;
  uint64_t max_gap;
};
// Filled by the write pass (zeroed before it).
struct WriteCheck {
  unsigned long long written;      // records found
  unsigned long long moved_tiles;  // tiles that disagree with the count pass
};
static_assert(sizeof(Totals) + sizeof(WriteCheck) == 4 * sizeof(uint64_t), "scratch layout");

// Scan element: records so far and the last change so far (+ 1). Indices increase along the
// buffer, so "last so far" is a maximum.
struct Progress {
  uint64_t count;
  uint64_t last_plus1;
};
struct CombineProgress {
  __device__ Progress operator()(const Progress& a, const Progress& b) const {
    return {a.count + b.count, a.last_plus1 > b.last_plus1 ? a.last_plus1 : b.last_plus1};
  }
};

// Shared memory for a block that scans, then (after a barrier) reduces.
template <typename Scan, typename Reduce>
union ScanOrReduce {
  typename Scan::TempStorage scan;
  typename Reduce::TempStorage reduce;
};

struct MaxOp {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; }
};
struct MinOp {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a < b ? a : b; }
};

// 16 bytes at `byte`: one vector load when aligned and whole, else byte by byte with zeros past
// the end (equal in both buffers, so never a change).
__device__ __forceinline__ uint4 LoadUnit(const uint8_t* p, uint64_t byte, uint64_t bytes,
                                          bool aligned) {
  if (aligned && byte + g::kUnitBytes <= bytes) {
    return *reinterpret_cast<const uint4*>(p + byte);
  }
  uint32_t w[4] = {0, 0, 0, 0};
  for (int k = 0; k < 16; ++k) {
    if (byte + k < bytes) w[k / 4] |= static_cast<uint32_t>(p[byte + k]) << (8 * (k % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// Bit j set when element j (of 16 / E) of the unit differs.
template <int E>
__device__ __forceinline__ uint32_t UnitMask(const uint4& a, const uint4& b) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t x = Word(a, k) ^ Word(b, k);
    if (E == 4) {
      m |= static_cast<uint32_t>(x != 0) << k;
    } else if (E == 2) {
      m |=
          (static_cast<uint32_t>((x & 0xffffu) != 0) | (static_cast<uint32_t>((x >> 16) != 0) << 1))
          << (2 * k);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        m |= static_cast<uint32_t>(((x >> (8 * j)) & 0xffu) != 0) << (4 * k + j);
    }
  }
  return m;
}

// Element j of a unit as an E-byte value.
template <int E>
__device__ __forceinline__ uint32_t UnitElement(const uint4& v, int j) {
  if (E == 4) return Word(v, j);
  if (E == 2) return (Word(v, j / 2) >> (16 * (j % 2))) & 0xffffu;
  return (Word(v, j / 4) >> (8 * (j % 4))) & 0xffu;
}

// This thread's units of `tile`: masks (and the new bytes when `keep` is set).
template <int E>
__device__ __forceinline__ void CompareUnits(const uint8_t* shadow, const uint8_t* next,
                                             uint64_t bytes, bool aligned, uint64_t unit0,
                                             uint32_t masks[g::kUnitsPerThread],
                                             uint4 values[g::kUnitsPerThread]) {
  uint4 a[g::kUnitsPerThread];
#pragma unroll
  for (int u = 0; u < g::kUnitsPerThread; ++u) {
    const uint64_t byte = (unit0 + u) * g::kUnitBytes;
    if (byte < bytes) {
      a[u] = LoadUnit(shadow, byte, bytes, aligned);
      values[u] = LoadUnit(next, byte, bytes, aligned);
    } else {
      a[u] = values[u] = make_uint4(0, 0, 0, 0);
    }
  }
#pragma unroll
  for (int u = 0; u < g::kUnitsPerThread; ++u) masks[u] = UnitMask<E>(a[u], values[u]);
}

template <int E>
__global__ void __launch_bounds__(g::kThreads)
    CountTiles(const uint8_t* shadow, const uint8_t* next, uint64_t bytes, bool aligned,
               TileSummary* tiles) {
  using Scan = cub::BlockScan<uint64_t, g::kThreads>;
  using Reduce = cub::BlockReduce<uint64_t, g::kThreads>;
  __shared__ ScanOrReduce<Scan, Reduce> tmp;
  const uint64_t unit0 = blockIdx.x * g::kUnitsPerTile + threadIdx.x * g::kUnitsPerThread;
  uint32_t masks[g::kUnitsPerThread];
  uint4 values[g::kUnitsPerThread];
  CompareUnits<E>(shadow, next, bytes, aligned, unit0, masks, values);

  uint64_t count = 0, first = ~uint64_t{0}, last_plus1 = 0, max_gap = 0;
#pragma unroll
  for (int u = 0; u < g::kUnitsPerThread; ++u) {
    for (uint32_t m = masks[u]; m != 0; m &= m - 1) {
      const uint64_t idx = (unit0 + u) * (16 / E) + (__ffs(m) - 1);
      if (last_plus1 != 0) {
        max_gap = max(max_gap, idx - (last_plus1 - 1));
      } else {
        first = idx;
      }
      last_plus1 = idx + 1;
      ++count;
    }
  }
  // The gap into this thread's first change from the last change of the threads before it.
  uint64_t before = 0;
  Scan(tmp.scan).ExclusiveScan(last_plus1, before, uint64_t{0}, MaxOp());
  if (count > 0 && before != 0) max_gap = max(max_gap, first - (before - 1));
  __syncthreads();
  const uint64_t tile_count = Reduce(tmp.reduce).Sum(count);
  __syncthreads();
  const uint64_t tile_first = Reduce(tmp.reduce).Reduce(first, MinOp());
  __syncthreads();
  const uint64_t tile_last = Reduce(tmp.reduce).Reduce(last_plus1, MaxOp());
  __syncthreads();
  const uint64_t tile_gap = Reduce(tmp.reduce).Reduce(max_gap, MaxOp());
  if (threadIdx.x == 0) tiles[blockIdx.x] = {tile_count, tile_first, tile_last, tile_gap};
}

__global__ void __launch_bounds__(g::kScanThreads)
    ScanTiles(const TileSummary* tiles, uint64_t n, TileScan* scans, Totals* totals) {
  using Scan = cub::BlockScan<Progress, g::kScanThreads>;
  using Reduce = cub::BlockReduce<uint64_t, g::kScanThreads>;
  __shared__ ScanOrReduce<Scan, Reduce> tmp;
  const uint64_t per = (n + g::kScanThreads - 1) / g::kScanThreads;  // TilesPerScanThread
  const uint64_t begin = min(n, threadIdx.x * per);
  const uint64_t end = min(n, begin + per);
  Progress mine{0, 0};
  for (uint64_t t = begin; t < end; ++t) {
    mine.count += tiles[t].count;
    mine.last_plus1 = max(mine.last_plus1, tiles[t].last_plus1);
  }
  Progress run;
  Scan(tmp.scan).ExclusiveScan(mine, run, Progress{0, 0}, CombineProgress());
  uint64_t max_gap = 0;
  for (uint64_t t = begin; t < end; ++t) {
    const TileSummary s = tiles[t];
    scans[t] = {run.count, run.last_plus1};
    if (s.count == 0) continue;
    // Record 0 counts from index 0; a tile's first change from the last change before it.
    const uint64_t prev = run.last_plus1 == 0 ? 0 : run.last_plus1 - 1;
    max_gap = max(max_gap, max(s.max_gap, s.first - prev));
    run.count += s.count;
    run.last_plus1 = max(run.last_plus1, s.last_plus1);
  }
  __syncthreads();
  const uint64_t all_gap = Reduce(tmp.reduce).Reduce(max_gap, MaxOp());
  if (threadIdx.x == g::kScanThreads - 1) totals->count = run.count;
  if (threadIdx.x == 0) totals->max_gap = all_gap;
}

template <typename T>
__device__ __forceinline__ void Store(uint8_t* base, uint64_t i, uint64_t v) {
  reinterpret_cast<T*>(base)[i] = static_cast<T>(v);
}

// `capacity`: the records the gap and value buffers hold (the count pass's total): never stored
// past, whatever this pass finds. Each block compares its tile with the count pass's summary
// (count, first and last change) and checks that its gaps fit W bytes; a disagreement (the
// source changed between the passes) is counted in check->moved_tiles, and check->written sums
// the records found, for the host to compare (WritePassError).
template <int E, int W>
__global__ void __launch_bounds__(g::kThreads)
    WriteTileRecords(uint8_t* shadow, const uint8_t* next, uint64_t bytes, bool aligned,
                     const TileSummary* tiles, const TileScan* scans, uint8_t* gaps,
                     uint8_t* values, uint64_t capacity, WriteCheck* check) {
  // A tile without changes in pass 1 is skipped whole: neither its records nor its shadow
  // units are written, so a change that appeared there since is simply not sent (and the
  // shadow keeps the old bytes, consistent with what the receiver holds).
  if (tiles[blockIdx.x].count == 0) return;
  using Scan = cub::BlockScan<Progress, g::kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ unsigned long long block_first;
  __shared__ int gap_overflow;
  if (threadIdx.x == 0) {
    block_first = ~0ull;
    gap_overflow = 0;
  }
  const uint64_t unit0 = blockIdx.x * g::kUnitsPerTile + threadIdx.x * g::kUnitsPerThread;
  uint32_t masks[g::kUnitsPerThread];
  uint4 units[g::kUnitsPerThread];
  CompareUnits<E>(shadow, next, bytes, aligned, unit0, masks, units);
  Progress mine{0, 0};
  uint64_t first = ~uint64_t{0};
#pragma unroll
  for (int u = 0; u < g::kUnitsPerThread; ++u) {
    if (masks[u] == 0) continue;
    if (mine.count == 0) first = (unit0 + u) * (16 / E) + (__ffs(masks[u]) - 1);
    mine.count += __popc(masks[u]);
    mine.last_plus1 = (unit0 + u) * (16 / E) + (31 - __clz(masks[u])) + 1;  // highest set bit
  }
  __syncthreads();  // block_first and gap_overflow are initialised
  if (mine.count != 0) atomicMin(&block_first, static_cast<unsigned long long>(first));
  const TileScan start = scans[blockIdx.x];
  Progress at, block;
  Scan(tmp).ExclusiveScan(mine, at, Progress{start.offset, start.last_plus1}, CombineProgress(),
                          block);
  uint64_t r = at.count;
  constexpr uint64_t kMaxGap = W == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * W)) - 1;
  uint64_t prev = at.last_plus1 == 0 ? 0 : at.last_plus1 - 1;
  using G = typename std::conditional<
      W == 1, uint8_t,
      typename std::conditional<
          W == 2, uint16_t,
          typename std::conditional<W == 4, uint32_t, uint64_t>::type>::type>::type;
  using V =
      typename std::conditional<E == 1, uint8_t,
                                typename std::conditional<E == 2, uint16_t, uint32_t>::type>::type;
#pragma unroll
  for (int u = 0; u < g::kUnitsPerThread; ++u) {
    for (uint32_t m = masks[u]; m != 0; m &= m - 1) {
      const int j = __ffs(m) - 1;
      const uint64_t idx = (unit0 + u) * (16 / E) + j;
      if (idx - prev > kMaxGap) gap_overflow = 1;
      if (r < capacity) {
        Store<G>(gaps, r, idx - prev);
        Store<V>(values, r, UnitElement<E>(units[u], j));
      }
      prev = idx;
      ++r;
    }
    if (masks[u] == 0) continue;
    // The shadow takes the new unit (equal elements stay equal).
    const uint64_t byte = (unit0 + u) * g::kUnitBytes;
    if (aligned && byte + g::kUnitBytes <= bytes) {
      *reinterpret_cast<uint4*>(shadow + byte) = units[u];
    } else {
      for (int k = 0; k < 16 && byte + k < bytes; ++k) shadow[byte + k] = next[byte + k];
    }
  }
  __syncthreads();  // every thread's atomicMin and gap check are in
  if (threadIdx.x == 0) {
    // `block` (the aggregate, without the scan's initial value): this pass's count and last
    // change of the tile.
    const TileSummary& was = tiles[blockIdx.x];
    atomicAdd(&check->written, static_cast<unsigned long long>(block.count));
    if (block.count != was.count || block.last_plus1 != was.last_plus1 ||
        block_first != was.first || gap_overflow != 0) {
      atomicAdd(&check->moved_tiles, 1ull);
    }
  }
}

bool Failed(cudaError_t e, const char* what, int device, std::string* error) {
  if (e == cudaSuccess) return false;
  cudaGetLastError();
  *error = std::string(what) + " on CUDA device " + std::to_string(device) + ": " +
           cudaGetErrorString(e);
  gpu::NoteCudaError(device, e, *error);
  return true;
}

template <int E>
void LaunchCount(uint64_t tiles, cudaStream_t s, const uint8_t* shadow, const uint8_t* next,
                 uint64_t bytes, bool aligned, TileSummary* summaries) {
  CountTiles<E><<<static_cast<unsigned>(tiles), g::kThreads, 0, s>>>(shadow, next, bytes, aligned,
                                                                     summaries);
}

// The write pass's arguments past the launch geometry.
struct WriteArgs {
  uint8_t* shadow;
  const uint8_t* next;
  uint64_t bytes;
  bool aligned;
  const TileSummary* summaries;
  const TileScan* scans;
  uint8_t* gaps;
  uint8_t* values;
  uint64_t capacity;
  WriteCheck* check;
};

template <int E, int W>
void LaunchWrite(uint64_t tiles, cudaStream_t s, const WriteArgs& a) {
  WriteTileRecords<E, W><<<static_cast<unsigned>(tiles), g::kThreads, 0, s>>>(
      a.shadow, a.next, a.bytes, a.aligned, a.summaries, a.scans, a.gaps, a.values, a.capacity,
      a.check);
}

template <int E>
void LaunchWriteWidth(int width, uint64_t tiles, cudaStream_t s, const WriteArgs& a) {
  switch (width) {
    case 1:
      return LaunchWrite<E, 1>(tiles, s, a);
    case 2:
      return LaunchWrite<E, 2>(tiles, s, a);
    case 4:
      return LaunchWrite<E, 4>(tiles, s, a);
    default:
      return LaunchWrite<E, 8>(tiles, s, a);
  }
}

bool Aligned(const void* a, const void* b) {
  return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % g::kUnitBytes) == 0;
}

}  // namespace

DeviceEncoder::~DeviceEncoder() {
  if (cudaSetDevice(device_) != cudaSuccess) return;
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (gaps_ != nullptr) cudaFree(gaps_);
  if (values_ != nullptr) cudaFree(values_);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

EncodeCode DeviceEncoder::Prepare(std::string* error) {
  if (std::string why = gpu::DeviceUnusableReason(device_); !why.empty()) {
    *error = why;
    return EncodeCode::kCudaError;
  }
  if (Failed(cudaSetDevice(device_), "cudaSetDevice", device_, error)) {
    return EncodeCode::kCudaError;
  }
  if (stream_ == nullptr) {
    cudaStream_t s = nullptr;
    if (Failed(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", device_,
               error)) {
      return EncodeCode::kCudaError;
    }
    stream_ = s;
  }
  return EncodeCode::kOk;
}

EncodeCode DeviceEncoder::EnsureScratch(void** buffer, uint64_t* capacity, uint64_t need,
                                        const char* what, std::string* error) {
  if (need <= *capacity) return EncodeCode::kOk;
  if (*buffer != nullptr) cudaFree(*buffer);
  *buffer = nullptr;
  *capacity = 0;
  const uint64_t grown = need + need / 4;
  if (Failed(cudaMalloc(buffer, grown), what, device_, error)) {
    *buffer = nullptr;
    return EncodeCode::kCudaError;
  }
  *capacity = grown;
  return EncodeCode::kOk;
}

EncodeCode DeviceEncoder::CountChanges(const uint8_t* shadow, const uint8_t* next, uint64_t bytes,
                                       int elem_size, ChangeCounts* counts, std::string* error) {
  *counts = {};
  if (bytes == 0) return EncodeCode::kOk;
  if (EncodeCode c = Prepare(error); c != EncodeCode::kOk) return c;
  const uint64_t tiles = g::TileCount(bytes);
  if (tiles > g::kMaxTiles) {
    *error = "delta buffer of " + std::to_string(bytes) + " bytes exceeds the GPU encoder's grid";
    return EncodeCode::kCudaError;
  }
  if (EncodeCode c = EnsureScratch(&scratch_, &scratch_capacity_, g::EncodeScratchBytes(bytes),
                                   "cudaMalloc of the delta encoder scratch", error);
      c != EncodeCode::kOk) {
    return c;
  }
  auto* summaries = static_cast<TileSummary*>(scratch_);
  auto* scans = reinterpret_cast<TileScan*>(summaries + tiles);
  auto* totals = reinterpret_cast<Totals*>(scans + tiles);
  auto s = static_cast<cudaStream_t>(stream_);
  const bool aligned = Aligned(shadow, next);
  switch (elem_size) {
    case 1:
      LaunchCount<1>(tiles, s, shadow, next, bytes, aligned, summaries);
      break;
    case 2:
      LaunchCount<2>(tiles, s, shadow, next, bytes, aligned, summaries);
      break;
    default:
      LaunchCount<4>(tiles, s, shadow, next, bytes, aligned, summaries);
      break;
  }
  if (Failed(cudaGetLastError(), "launching the delta count kernel", device_, error)) {
    return EncodeCode::kCudaError;
  }
  ScanTiles<<<1, g::kScanThreads, 0, s>>>(summaries, tiles, scans, totals);
  if (Failed(cudaGetLastError(), "launching the delta scan kernel", device_, error)) {
    return EncodeCode::kCudaError;
  }
  Totals host{};
  if (Failed(cudaMemcpyAsync(&host, totals, sizeof(host), cudaMemcpyDeviceToHost, s),
             "copying the delta totals", device_, error) ||
      Failed(cudaStreamSynchronize(s), "the delta count kernels", device_, error)) {
    return EncodeCode::kCudaError;
  }
  counts->count = host.count;
  counts->max_gap = host.max_gap;
  return EncodeCode::kOk;
}

EncodeCode DeviceEncoder::WriteRecords(uint8_t* shadow, const uint8_t* next, uint64_t bytes,
                                       int elem_size, uint64_t count, int index_width,
                                       uint8_t* gaps_host, uint8_t* values_host,
                                       std::string* error) {
  if (count == 0) return EncodeCode::kOk;
  if (EncodeCode c = Prepare(error); c != EncodeCode::kOk) return c;
  if (EncodeCode c = EnsureScratch(&gaps_, &gaps_capacity_, count * index_width,
                                   "cudaMalloc of the delta gaps", error);
      c != EncodeCode::kOk) {
    return c;
  }
  if (EncodeCode c = EnsureScratch(&values_, &values_capacity_, count * elem_size,
                                   "cudaMalloc of the delta values", error);
      c != EncodeCode::kOk) {
    return c;
  }
  const uint64_t tiles = g::TileCount(bytes);
  auto* summaries = static_cast<TileSummary*>(scratch_);
  auto* scans = reinterpret_cast<TileScan*>(summaries + tiles);
  auto* check = reinterpret_cast<WriteCheck*>(reinterpret_cast<Totals*>(scans + tiles) + 1);
  auto s = static_cast<cudaStream_t>(stream_);
  const WriteArgs args{shadow,
                       next,
                       bytes,
                       Aligned(shadow, next),
                       summaries,
                       scans,
                       static_cast<uint8_t*>(gaps_),
                       static_cast<uint8_t*>(values_),
                       count,
                       check};
  if (Failed(cudaMemsetAsync(check, 0, sizeof(WriteCheck), s), "clearing the write check", device_,
             error)) {
    return EncodeCode::kCudaError;
  }
  switch (elem_size) {
    case 1:
      LaunchWriteWidth<1>(index_width, tiles, s, args);
      break;
    case 2:
      LaunchWriteWidth<2>(index_width, tiles, s, args);
      break;
    default:
      LaunchWriteWidth<4>(index_width, tiles, s, args);
      break;
  }
  WriteCheck host_check{};
  if (Failed(cudaGetLastError(), "launching the delta write kernel", device_, error) ||
      Failed(cudaMemcpyAsync(gaps_host, args.gaps, count * index_width, cudaMemcpyDeviceToHost, s),
             "copying the delta gaps", device_, error) ||
      Failed(
          cudaMemcpyAsync(values_host, args.values, count * elem_size, cudaMemcpyDeviceToHost, s),
          "copying the delta values", device_, error) ||
      Failed(cudaMemcpyAsync(&host_check, check, sizeof(host_check), cudaMemcpyDeviceToHost, s),
             "copying the write check", device_, error) ||
      Failed(cudaStreamSynchronize(s), "the delta write kernel", device_, error)) {
    return EncodeCode::kCudaError;
  }
  *error = g::WritePassError(count, host_check.written, host_check.moved_tiles);
  if (!error->empty()) {
    return EncodeCode::kSourceChanged;
  }
  return EncodeCode::kOk;
}

EncodeCode DeviceEncoder::RefreshShadow(uint8_t* shadow, const uint8_t* next, uint64_t bytes,
                                        std::string* error) {
  if (EncodeCode c = Prepare(error); c != EncodeCode::kOk) return c;
  auto s = static_cast<cudaStream_t>(stream_);
  if (Failed(cudaMemcpyAsync(shadow, next, bytes, cudaMemcpyDefault, s), "refreshing the shadow",
             device_, error) ||
      Failed(cudaStreamSynchronize(s), "refreshing the shadow", device_, error)) {
    return EncodeCode::kCudaError;
  }
  return EncodeCode::kOk;
}

EncodeCode DeviceEncoder::AllocateShadow(uint64_t bytes, bool host, void** device_ptr,
                                         std::string* error) {
  *device_ptr = nullptr;
  if (Failed(cudaSetDevice(device_), "cudaSetDevice", device_, error)) {
    return EncodeCode::kCudaError;
  }
  if (!host) {
    if (Failed(cudaMalloc(device_ptr, bytes), "cudaMalloc of the delta shadow", device_, error)) {
      return EncodeCode::kCudaError;
    }
    return EncodeCode::kOk;
  }
  void* p = nullptr;
  if (Failed(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
             "cudaHostAlloc (mapped) of the delta shadow", device_, error)) {
    return EncodeCode::kCudaError;
  }
  if (Failed(cudaHostGetDevicePointer(device_ptr, p, 0), "cudaHostGetDevicePointer", device_,
             error)) {
    cudaFreeHost(p);
    return EncodeCode::kCudaError;
  }
  // With unified addressing (every 64-bit platform CUDA 13 supports) both pointers are equal,
  // which FreeShadow relies on.
  if (*device_ptr != p) {
    cudaFreeHost(p);
    *device_ptr = nullptr;
    *error = "mapped pinned memory has a different device address (no unified addressing)";
    return EncodeCode::kCudaError;
  }
  return EncodeCode::kOk;
}

void DeviceEncoder::FreeShadow(void* device_ptr, bool host, int device) {
  if (device_ptr == nullptr) return;
  if (cudaSetDevice(device) != cudaSuccess) return;
  if (host) {
    cudaFreeHost(device_ptr);
  } else {
    cudaFree(device_ptr);
  }
}

EncodeCode DeviceEncoder::Copy(void* dst, const void* src, uint64_t bytes, std::string* error) {
  if (bytes == 0) return EncodeCode::kOk;
  if (Failed(cudaSetDevice(device_), "cudaSetDevice", device_, error) ||
      Failed(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy", device_, error)) {
    return EncodeCode::kCudaError;
  }
  return EncodeCode::kOk;
}

}  // namespace wb::delta::cuda
