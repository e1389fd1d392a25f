// Scalar number-format conversions (f32, bf16, f16, fp8 e4m3fn) done on integer bit patterns.
// The CPU transforms and the CUDA kernels both include this header, so every conversion rounds
// identically on both sides (round-to-nearest-even, no fast-math, no FMA involved).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define WB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define WB_HOST_DEVICE inline
#endif

namespace wb::transform::bits {

// Largest finite e4m3fn magnitude and its encoding; e4m3fn has no Inf, 0x7f / 0xff are NaN.
constexpr float kFp8E4M3Max = 448.0f;
constexpr uint8_t kFp8E4M3MaxBits = 0x7e;
constexpr uint8_t kFp8E4M3NanBits = 0x7f;

// f32 <-> its bits: CUDA's intrinsics on the device; on the host memcpy, the portable bit cast
// (compiled to a register move).
#if defined(__CUDA_ARCH__)
WB_HOST_DEVICE uint32_t FloatToBits(float f) { return __float_as_uint(f); }
WB_HOST_DEVICE float BitsToFloat(uint32_t u) { return __uint_as_float(u); }
#else
template <typename To, typename From>
WB_HOST_DEVICE To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}
WB_HOST_DEVICE uint32_t FloatToBits(float f) { return BitCast<uint32_t>(f); }
WB_HOST_DEVICE float BitsToFloat(uint32_t u) { return BitCast<float>(u); }
#endif

// bf16 is the top half of an f32: widening is exact.
WB_HOST_DEVICE float Bf16ToF32(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// Round-to-nearest-even; NaN stays a quiet NaN with its sign; values past the largest bf16
// round to +-Inf as IEEE prescribes.
WB_HOST_DEVICE uint16_t F32ToBf16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Exact. Written without branches (selects only) so that CPU loops vectorise.
WB_HOST_DEVICE float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t a = h & 0x7fffu;
  const uint32_t normal = (a << 13) + (112u << 23);  // rebias the exponent
  const uint32_t inf_nan = (a << 13) | 0x7f800000u;
  // Subnormals (and zero): a * 2^-24, exact in f32.
  const uint32_t sub =
      FloatToBits(static_cast<float>(static_cast<int32_t>(a)) * 5.9604644775390625e-8f);
  const uint32_t r = a >= 0x7c00u ? inf_nan : (a >= 0x0400u ? normal : sub);
  return BitsToFloat(sign | r);
}

// Adds two floats with round-to-nearest-even on both host and device (never contracted).
WB_HOST_DEVICE float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Formats narrower than f32 that F32ToNarrow rounds into: mantissa bits and exponent bias, the
// |f| bits from which on a value overflows and its code there, the NaN code (and the mask of the
// f32 mantissa's top bits it keeps), and where the sign bit goes.
// f16: IEEE, everything >= 65520 becomes Inf; NaN stays a quiet NaN with its payload's top bits.
struct F16Format {
  static constexpr int kMant = 10, kBias = 15, kSignShift = 16;
  static constexpr uint32_t kOverflowFrom = 0x477ff000u, kOverflowBits = 0x7c00u;
  static constexpr uint32_t kNanBits = 0x7e00u, kNanPayload = 0x1ffu;
};
// e4m3fn, saturating: |x| >= 448 (Inf included) -> 448; NaN -> 0x7f.
struct Fp8E4M3SatFormat {
  static constexpr int kMant = 3, kBias = 7, kSignShift = 24;
  static constexpr uint32_t kOverflowFrom = 0x43e00000u, kOverflowBits = kFp8E4M3MaxBits;
  static constexpr uint32_t kNanBits = kFp8E4M3NanBits, kNanPayload = 0;
};

// Round-to-nearest-even into Format, subnormals included; the sign is kept (-0 too).
// Normal range: drop mantissa bits with round-to-nearest-even, rebias the exponent. Below the
// smallest normal, 2^(1 - kBias): |f| + 2^(24 - kBias - kMant) has an ulp of the format's
// subnormal step, so the float addition rounds |f| to the nearest even multiple of that step
// (the smallest normal itself comes out as the first normal code).
// Branch-free (selects only) so that CPU loops vectorise.
template <typename Format>
WB_HOST_DEVICE uint32_t F32ToNarrow(float f) {
  constexpr int kDrop = 23 - Format::kMant;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - Format::kBias) << 23;
  constexpr uint32_t kSubAddBits = static_cast<uint32_t>(151 - Format::kBias - Format::kMant) << 23;
  const uint32_t u = FloatToBits(f);
  const uint32_t sign = (u >> Format::kSignShift) & (0x80000000u >> Format::kSignShift);
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t normal = ((a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u)) >> kDrop) -
                          (static_cast<uint32_t>(127 - Format::kBias) << Format::kMant);
  const uint32_t sub = FloatToBits(AddRn(BitsToFloat(a), BitsToFloat(kSubAddBits))) - kSubAddBits;
  uint32_t r = a < kMinNormalBits ? sub : normal;
  r = a >= Format::kOverflowFrom ? Format::kOverflowBits : r;
  r = a > 0x7f800000u ? (Format::kNanBits | ((a >> kDrop) & Format::kNanPayload)) : r;
  return sign | r;
}

WB_HOST_DEVICE uint16_t F32ToF16(float f) {
  return static_cast<uint16_t>(F32ToNarrow<F16Format>(f));
}

// -0 -> 0x80; NaN -> 0x7f with the sign bit of the input.
WB_HOST_DEVICE uint8_t F32ToFp8E4M3Sat(float f) {
  return static_cast<uint8_t>(F32ToNarrow<Fp8E4M3SatFormat>(f));
}

// Exact: every e4m3fn value is an f32. Branch-free.
WB_HOST_DEVICE float Fp8E4M3ToF32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t a = v & 0x7fu;
  const uint32_t normal = (a << 20) + (120u << 23);
  // Subnormals (and zero): a * 2^-9, exact in f32.
  const uint32_t sub = FloatToBits(static_cast<float>(static_cast<int32_t>(a)) * 0.001953125f);
  uint32_t r = a >= 0x08u ? normal : sub;
  r = a == 0x7fu ? 0x7fc00000u : r;
  return BitsToFloat(sign | r);
}

// |x| for the block amax: NaN and +-Inf are ignored (they count as 0), so one non-finite value
// does not wipe out the scale of the 16383 finite values around it.
WB_HOST_DEVICE float FiniteAbs(float x) {
  uint32_t a = FloatToBits(x) & 0x7fffffffu;
  return a >= 0x7f800000u ? 0.0f : BitsToFloat(a);
}

}  // namespace wb::transform::bits
