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

WB_HOST_DEVICE uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

WB_HOST_DEVICE float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

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

// Round-to-nearest-even; overflow goes to +-Inf (IEEE: everything >= 65520 becomes Inf);
// NaN stays a quiet NaN with its sign; results below the f16 normal range become subnormals.
// Branch-free (selects only) so that CPU loops vectorise.
WB_HOST_DEVICE uint16_t F32ToF16(float f) {
  const uint32_t u = FloatToBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // f16 normal range: drop 13 mantissa bits with round-to-nearest-even, rebias by 112.
  const uint32_t normal = ((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - (112u << 10);
  // Below 2^-14: |f| + 0.5 has an ulp of 2^-24, so the float addition rounds |f| to the
  // nearest even multiple of 2^-24 (the f16 subnormal step); 2^-14 itself comes out as 0x400.
  const uint32_t sub = FloatToBits(AddRn(BitsToFloat(a), 0.5f)) - 0x3f000000u;
  uint32_t r = a < 0x38800000u ? sub : normal;
  r = a >= 0x477ff000u ? 0x7c00u : r;                          // >= 65520: Inf
  r = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x1ffu)) : r;  // NaN
  return static_cast<uint16_t>(sign | r);
}

// e4m3fn with saturation: round-to-nearest-even, |x| >= 448 (Inf included) -> +-448 (0x7e/0xfe),
// NaN -> 0x7f with the sign bit of the input, -0 -> 0x80. Branch-free so CPU loops vectorise.
WB_HOST_DEVICE uint8_t F32ToFp8E4M3Sat(float f) {
  const uint32_t u = FloatToBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  // e4m3 normal range (>= 2^-6): keep 3 mantissa bits, round to nearest even, rebias by 120.
  const uint32_t normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  // Below 2^-6: |f| + 2^14 has an ulp of 2^-9, so the float addition rounds |f| to the nearest
  // even multiple of 2^-9 (the e4m3 subnormal step); 2^-6 itself comes out as 0x08.
  const uint32_t sub = FloatToBits(AddRn(BitsToFloat(a), 16384.0f)) - 0x46800000u;
  uint32_t r = a < 0x3c800000u ? sub : normal;
  r = a >= 0x43e00000u ? kFp8E4M3MaxBits : r;  // >= 448 and Inf saturate
  r = a > 0x7f800000u ? kFp8E4M3NanBits : r;
  return static_cast<uint8_t>(sign | r);
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
