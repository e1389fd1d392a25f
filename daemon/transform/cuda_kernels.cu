// CUDA kernels of the transforms. Every conversion goes through float_bits.h (integer bit
// manipulation) and the two float operations of fp8 quantisation use __fdiv_rn / __fmul_rn
// (and the build passes -fmad=false -prec-div=true -ftz=false), so results match the CPU
// reference bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/gpu/device_health.h"
#include "daemon/transform/copy_plan.h"
#include "daemon/transform/cuda_kernels.h"
#include "daemon/transform/float_bits.h"

namespace wb::transform::cuda {
namespace {

namespace b = ::wb::transform::bits;

constexpr int kThreads = 256;
constexpr unsigned kMaxGridY = 65535;

template <DType D>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using Bits = uint32_t;
  __device__ static float ToF32(Bits v) { return b::BitsToFloat(v); }
  __device__ static Bits FromF32(float f) { return b::FloatToBits(f); }
};
template <>
struct Elem<DType::kF16> {
  using Bits = uint16_t;
  __device__ static float ToF32(Bits v) { return b::F16ToF32(v); }
  __device__ static Bits FromF32(float f) { return b::F32ToF16(f); }
};
template <>
struct Elem<DType::kBF16> {
  using Bits = uint16_t;
  __device__ static float ToF32(Bits v) { return b::Bf16ToF32(v); }
  __device__ static Bits FromF32(float f) { return b::F32ToBf16(f); }
};

// grid.x covers the columns, grid.y strides over the rows.
template <DType S, DType D>
__global__ void CastKernel(const uint8_t* src, uint8_t* dst, uint64_t rows, uint64_t cols,
                           uint64_t src_stride, uint64_t dst_stride) {
  using SB = typename Elem<S>::Bits;
  using DB = typename Elem<D>::Bits;
  const uint64_t c = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (uint64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const SB v = reinterpret_cast<const SB*>(src + r * src_stride)[c];
    reinterpret_cast<DB*>(dst + r * dst_stride)[c] = Elem<D>::FromF32(Elem<S>::ToF32(v));
  }
}

// One thread block per 128x128 tile: 256 threads, each holding 2 adjacent columns of 32 rows
// in registers (two bf16 packed per 32-bit register), so the tile is read from memory once
// for both the amax and the quantisation. kPaired: the two columns are loaded as one 32-bit
// word and stored as one 16-bit word (rows 4-byte aligned, even column count).
constexpr int kTile = 128;
constexpr int kColPairs = kTile / 2;              // 64 threads across a row
constexpr int kRowGroups = kThreads / kColPairs;  // 4 rows at a time
constexpr int kRowIters = kTile / kRowGroups;     // 32

__device__ __forceinline__ uint32_t FiniteAbsBits(uint32_t v) {
  const uint32_t a = v & 0x7fffu;
  return a >= 0x7f80u ? 0u : a;
}

// The sign comes from the input, not the quotient: the device's division returns its one
// canonical NaN (sign lost), the CPU's keeps the operand's. scale > 0, so for every other value
// the quotient has the input's sign anyway (-0 and underflow to -0 included).
__device__ __forceinline__ uint8_t QuantizeBf16(uint32_t v, float scale) {
  const uint8_t q = b::F32ToFp8E4M3Sat(__fdiv_rn(b::Bf16ToF32(static_cast<uint16_t>(v)), scale));
  return static_cast<uint8_t>((q & 0x7fu) | ((v >> 8) & 0x80u));
}

template <bool kPaired>
__global__ void __launch_bounds__(kThreads)
    Fp8BlockQuantKernel(const uint8_t* src, uint8_t* dst, uint8_t* scales, uint64_t rows,
                        uint64_t cols, uint64_t src_stride, uint64_t dst_stride,
                        uint64_t scale_stride) {
  __shared__ uint32_t warp_amax[kThreads / 32];
  const int row_group = threadIdx.x / kColPairs;
  const uint64_t c0 = static_cast<uint64_t>(blockIdx.x) * kTile;
  const uint64_t c = 2 * (threadIdx.x % kColPairs);  // this thread's columns: c, c + 1
  const uint64_t ncols = min(static_cast<uint64_t>(kTile), cols - c0);
  const bool has0 = c < ncols, has1 = c + 1 < ncols;
  for (uint64_t br = blockIdx.y; br * kTile < rows; br += gridDim.y) {
    const uint64_t r0 = br * kTile;
    const uint64_t nrows = min(static_cast<uint64_t>(kTile), rows - r0);
    uint32_t v[kRowIters];  // column c in the low half, c + 1 in the high half
    uint32_t amax = 0;
#pragma unroll
    for (int i = 0; i < kRowIters; ++i) {
      const uint64_t r = row_group + static_cast<uint64_t>(i) * kRowGroups;
      v[i] = 0;
      if (r < nrows) {
        const uint8_t* row = src + (r0 + r) * src_stride + (c0 + c) * 2;
        if (kPaired) {
          if (has0) v[i] = *reinterpret_cast<const uint32_t*>(row);
        } else {
          const uint32_t lo = has0 ? *reinterpret_cast<const uint16_t*>(row) : 0u;
          const uint32_t hi = has1 ? *reinterpret_cast<const uint16_t*>(row + 2) : 0u;
          v[i] = lo | (hi << 16);
        }
      }
      amax = max(amax, max(FiniteAbsBits(v[i]), FiniteAbsBits(v[i] >> 16)));
    }
    // Integer max of non-negative float bit patterns equals the float max: the order of the
    // reduction cannot change the result.
    for (int off = 16; off > 0; off /= 2) {
      amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) amax = max(amax, warp_amax[w]);
    __syncthreads();  // warp_amax is reused by the next block row
    const float amax_f = b::Bf16ToF32(static_cast<uint16_t>(amax));
    const float scale = amax != 0 ? __fdiv_rn(amax_f, b::kFp8E4M3Max) : 1.0f;
    if (threadIdx.x == 0) {
      reinterpret_cast<float*>(scales + br * scale_stride)[blockIdx.x] = scale;
    }
#pragma unroll
    for (int i = 0; i < kRowIters; ++i) {
      const uint64_t r = row_group + static_cast<uint64_t>(i) * kRowGroups;
      if (r >= nrows || !has0) continue;
      uint8_t* out = dst + (r0 + r) * dst_stride + c0 + c;
      const uint8_t q0 = QuantizeBf16(v[i] & 0xffffu, scale);
      if (kPaired) {
        const uint8_t q1 = QuantizeBf16(v[i] >> 16, scale);
        *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(q0 | (q1 << 8));
      } else {
        out[0] = q0;
        if (has1) out[1] = QuantizeBf16(v[i] >> 16, scale);
      }
    }
  }
}

template <bool kToF32>
__global__ void Fp8BlockDequantKernel(const uint8_t* src, uint8_t* dst, const uint8_t* scales,
                                      uint64_t rows, uint64_t cols, uint64_t src_stride,
                                      uint64_t dst_stride, uint64_t scale_stride) {
  const uint64_t c = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (uint64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float scale =
        reinterpret_cast<const float*>(scales + (r / kTile) * scale_stride)[c / kTile];
    // NaN passes unscaled: the device's multiply would return its canonical NaN, where the
    // CPU keeps the operand's sign and payload (0x7fc00000 | sign).
    const uint8_t q = src[r * src_stride + c];
    const float raw = b::Fp8E4M3ToF32(q);
    const float v = (q & 0x7fu) == 0x7fu ? raw : __fmul_rn(raw, scale);
    if (kToF32) {
      reinterpret_cast<float*>(dst + r * dst_stride)[c] = v;
    } else {
      reinterpret_cast<uint16_t*>(dst + r * dst_stride)[c] = b::F32ToBf16(v);
    }
  }
}

using CastLauncher = void (*)(dim3, cudaStream_t, const uint8_t*, uint8_t*, uint64_t, uint64_t,
                              uint64_t, uint64_t);

template <DType S, DType D>
void LaunchCast(dim3 grid, cudaStream_t stream, const uint8_t* src, uint8_t* dst, uint64_t rows,
                uint64_t cols, uint64_t ss, uint64_t ds) {
  CastKernel<S, D><<<grid, kThreads, 0, stream>>>(src, dst, rows, cols, ss, ds);
}

template <DType S>
CastLauncher PickCastForSrc(DType dst) {
  switch (dst) {
    case DType::kF32:
      return &LaunchCast<S, DType::kF32>;
    case DType::kF16:
      return &LaunchCast<S, DType::kF16>;
    case DType::kBF16:
      return &LaunchCast<S, DType::kBF16>;
    default:
      return nullptr;
  }
}

CastLauncher PickCast(DType src, DType dst) {
  switch (src) {
    case DType::kF32:
      return PickCastForSrc<DType::kF32>(dst);
    case DType::kF16:
      return PickCastForSrc<DType::kF16>(dst);
    case DType::kBF16:
      return PickCastForSrc<DType::kBF16>(dst);
    default:
      return nullptr;
  }
}

dim3 ElementGrid(uint64_t rows, uint64_t cols) {
  return dim3(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
              static_cast<unsigned>(std::min<uint64_t>(rows, kMaxGridY)));
}

LaunchCode Fail(cudaError_t err, const char* what, std::string* error) {
  cudaGetLastError();  // clear it, so the next launch is not blamed for it
  *error = std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  int device = -1;
  if (cudaGetDevice(&device) == cudaSuccess) gpu::NoteCudaError(device, err, *error);
  return LaunchCode::kCudaError;
}

}  // namespace

LaunchCode LaunchTransform(const TransformDesc& d, const void* src_v, void* dst_v, float* scales_v,
                           void* stream_v, std::string* error) {
  int devices = 0;
  if (cudaError_t err = cudaGetDeviceCount(&devices); err != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    *error = std::string("no CUDA device") +
             (err != cudaSuccess ? std::string(" (") + cudaGetErrorString(err) + ")" : "");
    return LaunchCode::kNoDevice;
  }
  const auto* src = static_cast<const uint8_t*>(src_v);
  auto* dst = static_cast<uint8_t*>(dst_v);
  auto* scales = reinterpret_cast<uint8_t*>(scales_v);
  auto stream = static_cast<cudaStream_t>(stream_v);
  if (d.rows == 0 || d.cols == 0) return LaunchCode::kOk;
  switch (d.kind) {
    case Kind::kCopy:
    case Kind::kCast:
      if (d.src_dtype == d.dst_dtype) {
        const size_t width = d.cols * (d.src_dtype == DType::kF32      ? 4
                                       : d.src_dtype == DType::kF8E4M3 ? 1
                                                                       : 2);
        const SameDtypeCopy plan = PlanSameDtypeCopy(d.rows, width, d.src_stride, d.dst_stride);
        switch (plan.shape) {
          case CopyShape::kFlat:
            if (cudaError_t err =
                    cudaMemcpyAsync(dst, src, width * d.rows, cudaMemcpyDeviceToDevice, stream);
                err != cudaSuccess) {
              return Fail(err, "cudaMemcpyAsync", error);
            }
            break;
          case CopyShape::kPitched:
            if (cudaError_t err = cudaMemcpy2DAsync(dst, plan.dst_pitch, src, plan.src_pitch, width,
                                                    d.rows, cudaMemcpyDeviceToDevice, stream);
                err != cudaSuccess) {
              return Fail(err, "cudaMemcpy2DAsync", error);
            }
            break;
          case CopyShape::kPerRow:
            for (uint64_t r = 0; r < d.rows; ++r) {
              if (cudaError_t err =
                      cudaMemcpyAsync(dst + r * plan.dst_pitch, src + r * plan.src_pitch, width,
                                      cudaMemcpyDeviceToDevice, stream);
                  err != cudaSuccess) {
                return Fail(err, "cudaMemcpyAsync (one row)", error);
              }
            }
            break;
        }
        return LaunchCode::kOk;
      } else {
        CastLauncher launch = PickCast(d.src_dtype, d.dst_dtype);
        if (launch == nullptr) {
          *error = "unsupported cast";
          return LaunchCode::kCudaError;
        }
        launch(ElementGrid(d.rows, d.cols), stream, src, dst, d.rows, d.cols, d.src_stride,
               d.dst_stride);
      }
      break;
    case Kind::kFp8Block: {
      const uint64_t block_rows = (d.rows + kTile - 1) / kTile;
      const dim3 grid(static_cast<unsigned>((d.cols + kTile - 1) / kTile),
                      static_cast<unsigned>(std::min<uint64_t>(block_rows, kMaxGridY)));
      // Paired loads and stores need 4-byte aligned source rows, 2-byte aligned destination
      // rows and an even column count (so a pair never straddles the row end).
      const bool paired = reinterpret_cast<uintptr_t>(src) % 4 == 0 && d.src_stride % 4 == 0 &&
                          reinterpret_cast<uintptr_t>(dst) % 2 == 0 && d.dst_stride % 2 == 0 &&
                          d.cols % 2 == 0;
      if (paired) {
        Fp8BlockQuantKernel<true><<<grid, kThreads, 0, stream>>>(
            src, dst, scales, d.rows, d.cols, d.src_stride, d.dst_stride, d.scale_stride);
      } else {
        Fp8BlockQuantKernel<false><<<grid, kThreads, 0, stream>>>(
            src, dst, scales, d.rows, d.cols, d.src_stride, d.dst_stride, d.scale_stride);
      }
      break;
    }
    case Kind::kFp8BlockDequant:
      if (d.dst_dtype == DType::kF32) {
        Fp8BlockDequantKernel<true><<<ElementGrid(d.rows, d.cols), kThreads, 0, stream>>>(
            src, dst, scales, d.rows, d.cols, d.src_stride, d.dst_stride, d.scale_stride);
      } else {
        Fp8BlockDequantKernel<false><<<ElementGrid(d.rows, d.cols), kThreads, 0, stream>>>(
            src, dst, scales, d.rows, d.cols, d.src_stride, d.dst_stride, d.scale_stride);
      }
      break;
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return Fail(err, "kernel launch", error);
  }
  return LaunchCode::kOk;
}

}  // namespace wb::transform::cuda
