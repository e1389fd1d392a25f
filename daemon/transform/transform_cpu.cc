// CPU implementation of the transforms: rows (or 128-row block rows) split across threads.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parallel/parallel_for.h"
#include "daemon/transform/float_bits.h"
#include "daemon/transform/fp8_avx2.h"
#include "daemon/transform/transform.h"

namespace wb::transform {
namespace {

// Below this many elements the threads cost more than they save.
constexpr uint64_t kMinElemsPerThread = 1 << 18;

int PickThreads(int requested, uint64_t elems) {
  int threads = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(threads, 1);
  const uint64_t useful = std::max<uint64_t>(1, elems / kMinElemsPerThread);
  return static_cast<int>(std::min<uint64_t>(threads, useful));
}

template <DType D>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using Bits = uint32_t;
  static float ToF32(Bits b) { return bits::BitsToFloat(b); }
  static Bits FromF32(float f) { return bits::FloatToBits(f); }
};
template <>
struct Elem<DType::kF16> {
  using Bits = uint16_t;
  static float ToF32(Bits b) { return bits::F16ToF32(b); }
  static Bits FromF32(float f) { return bits::F32ToF16(f); }
};
template <>
struct Elem<DType::kBF16> {
  using Bits = uint16_t;
  static float ToF32(Bits b) { return bits::Bf16ToF32(b); }
  static Bits FromF32(float f) { return bits::F32ToBf16(f); }
};

template <typename T>
T Load(const uint8_t* p, uint64_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, uint64_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

struct Plane {
  const uint8_t* src;
  uint8_t* dst;
  const TransformDesc& desc;
};

template <DType S, DType D>
void CastRow(const uint8_t* src, uint8_t* dst, uint64_t cols) {
  using SB = typename Elem<S>::Bits;
  using DB = typename Elem<D>::Bits;
  for (uint64_t c = 0; c < cols; ++c) {
    Store<DB>(dst, c, Elem<D>::FromF32(Elem<S>::ToF32(Load<SB>(src, c))));
  }
}

using RowFn = void (*)(const uint8_t*, uint8_t*, uint64_t);

template <DType S>
RowFn PickCastRowForSrc(DType dst) {
  switch (dst) {
    case DType::kF32:
      return &CastRow<S, DType::kF32>;
    case DType::kF16:
      return &CastRow<S, DType::kF16>;
    case DType::kBF16:
      return &CastRow<S, DType::kBF16>;
    default:
      return nullptr;
  }
}

RowFn PickCastRow(DType src, DType dst) {
  switch (src) {
    case DType::kF32:
      return PickCastRowForSrc<DType::kF32>(dst);
    case DType::kF16:
      return PickCastRowForSrc<DType::kF16>(dst);
    case DType::kBF16:
      return PickCastRowForSrc<DType::kBF16>(dst);
    default:
      return nullptr;
  }
}

void CopyRow(const uint8_t* src, uint8_t* dst, uint64_t bytes) { std::memcpy(dst, src, bytes); }

// Rows are handed out in chunks so each thread streams through contiguous memory.
void RunRows(const Plane& p, int threads, RowFn fn, uint64_t row_arg) {
  const TransformDesc& d = p.desc;
  const uint64_t chunk = std::max<uint64_t>(1, d.rows / (static_cast<uint64_t>(threads) * 8));
  const uint64_t units = (d.rows + chunk - 1) / chunk;
  ParallelFor(units, threads, [&](uint64_t u) {
    const uint64_t end = std::min(d.rows, (u + 1) * chunk);
    for (uint64_t r = u * chunk; r < end; ++r) {
      fn(p.src + r * d.src_stride, p.dst + r * d.dst_stride, row_arg);
    }
  });
}

// Largest finite |x| of a bf16 block. For non-negative floats the integer order of the bit
// patterns is the numeric order, so the max runs on integers (and vectorises).
uint16_t BlockAmaxBitsScalar(const uint8_t* src, uint64_t stride, uint64_t rows, uint64_t cols) {
  uint16_t amax = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint8_t* row = src + r * stride;
    for (uint64_t c = 0; c < cols; ++c) {
      uint16_t a = Load<uint16_t>(row, c) & 0x7fff;
      a = a >= 0x7f80 ? 0 : a;  // NaN and Inf do not count
      amax = std::max(amax, a);
    }
  }
  return amax;
}

// The block scale (see ApplyTransformCpu in transform.h); the CUDA kernel computes the same.
float ScaleForAmax(float amax) { return amax > 0.0f ? amax / bits::kFp8E4M3Max : 1.0f; }

// Quantises n elements of one row with one block scale: x / scale in float32 (IEEE division,
// as on the GPU), then round-to-nearest-even into e4m3fn with saturation.
void QuantizeRowSegmentScalar(const uint8_t* src, uint8_t* dst, uint64_t n, float scale) {
  for (uint64_t c = 0; c < n; ++c) {
    dst[c] = bits::F32ToFp8E4M3Sat(bits::Bf16ToF32(Load<uint16_t>(src, c)) / scale);
  }
}

uint16_t BlockAmaxBits(const uint8_t* src, uint64_t stride, uint64_t rows, uint64_t cols) {
  return HaveAvx2() ? BlockAmaxBitsAvx2(src, stride, rows, cols)
                    : BlockAmaxBitsScalar(src, stride, rows, cols);
}

void QuantizeRowSegment(const uint8_t* src, uint8_t* dst, uint64_t n, float scale) {
  if (HaveAvx2()) {
    QuantizeRowSegmentAvx2(src, dst, n, scale);
  } else {
    QuantizeRowSegmentScalar(src, dst, n, scale);
  }
}

void QuantizeBlockRow(const Plane& p, float* scales, uint64_t block_row) {
  const TransformDesc& d = p.desc;
  const uint64_t r0 = block_row * kFp8BlockSize;
  const uint64_t nrows = std::min<uint64_t>(kFp8BlockSize, d.rows - r0);
  float* scale_row =
      reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(scales) + block_row * d.scale_stride);
  for (uint64_t c0 = 0; c0 < d.cols; c0 += kFp8BlockSize) {
    const uint64_t ncols = std::min<uint64_t>(kFp8BlockSize, d.cols - c0);
    const uint8_t* src = p.src + r0 * d.src_stride + c0 * 2;
    uint8_t* dst = p.dst + r0 * d.dst_stride + c0;
    const float scale =
        ScaleForAmax(bits::Bf16ToF32(BlockAmaxBits(src, d.src_stride, nrows, ncols)));
    scale_row[c0 / kFp8BlockSize] = scale;
    for (uint64_t r = 0; r < nrows; ++r) {
      QuantizeRowSegment(src + r * d.src_stride, dst + r * d.dst_stride, ncols, scale);
    }
  }
}

template <typename Out>
void DequantizeRowBlock(const uint8_t* src, uint8_t* dst, uint64_t n, float scale) {
  for (uint64_t c = 0; c < n; ++c) {
    const float v = bits::Fp8E4M3ToF32(src[c]) * scale;
    if constexpr (sizeof(Out) == 4) {
      Store<float>(dst, c, v);
    } else {
      Store<uint16_t>(dst, c, bits::F32ToBf16(v));
    }
  }
}

void DequantizeBlockRow(const Plane& p, const float* scales, uint64_t block_row) {
  const TransformDesc& d = p.desc;
  const uint64_t r0 = block_row * kFp8BlockSize;
  const uint64_t nrows = std::min<uint64_t>(kFp8BlockSize, d.rows - r0);
  const float* scale_row = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(scales) +
                                                          block_row * d.scale_stride);
  const size_t out_size = ElementSize(d.dst_dtype);
  for (uint64_t r = r0; r < r0 + nrows; ++r) {
    const uint8_t* s = p.src + r * d.src_stride;
    uint8_t* o = p.dst + r * d.dst_stride;
    for (uint64_t c0 = 0; c0 < d.cols; c0 += kFp8BlockSize) {
      const uint64_t n = std::min<uint64_t>(kFp8BlockSize, d.cols - c0);
      const float scale = scale_row[c0 / kFp8BlockSize];
      if (out_size == 4) {
        DequantizeRowBlock<float>(s + c0, o + c0 * 4, n, scale);
      } else {
        DequantizeRowBlock<uint16_t>(s + c0, o + c0 * 2, n, scale);
      }
    }
  }
}

}  // namespace

absl::Status ApplyTransformCpu(const TransformDesc& desc_in, const void* src, void* dst,
                               float* scales, int threads) {
  TransformDesc desc = desc_in;
  if (absl::Status s = ValidateDesc(desc); !s.ok()) return s;
  if (desc.rows == 0 || desc.cols == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("transform ", KindName(desc.kind), ": null source or destination pointer"));
  }
  const bool uses_scales = desc.kind == Kind::kFp8Block || desc.kind == Kind::kFp8BlockDequant;
  if (uses_scales && scales == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("transform ", KindName(desc.kind), ": needs a scales buffer"));
  }
  const int n = PickThreads(threads, desc.rows * desc.cols);
  const Plane plane{static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), desc};
  switch (desc.kind) {
    case Kind::kCopy:
      RunRows(plane, n, &CopyRow, desc.cols * ElementSize(desc.src_dtype));
      break;
    case Kind::kCast:
      if (desc.src_dtype == desc.dst_dtype) {
        RunRows(plane, n, &CopyRow, desc.cols * ElementSize(desc.src_dtype));
      } else {
        RunRows(plane, n, PickCastRow(desc.src_dtype, desc.dst_dtype), desc.cols);
      }
      break;
    case Kind::kFp8Block:
      ParallelFor(ScaleRows(desc), n, [&](uint64_t br) { QuantizeBlockRow(plane, scales, br); });
      break;
    case Kind::kFp8BlockDequant:
      ParallelFor(ScaleRows(desc), n, [&](uint64_t br) { DequantizeBlockRow(plane, scales, br); });
      break;
  }
  return absl::OkStatus();
}

}  // namespace wb::transform
