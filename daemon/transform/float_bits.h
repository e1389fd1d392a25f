// Scalar number-format conversions (f32, bf16, f16, fp8 e4m3fn) done on integer bit patterns.
// The CPU transforms and the CUDA kernels both include this header, so every conversion rounds
// identically on both sides (round-to-nearest-even, no fast-math, no FMA involved).
#ifndef WB_DAEMON_TRANSFORM_FLOAT_BITS_H_
#define WB_DAEMON_TRANSFORM_FLOAT_BITS_H_

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

WB_HOST_DEVICE float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);
  // Subnormal f16: normalise into an f32 normal.
  uint32_t e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return BitsToFloat(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

// Rounds sig >> shift to nearest even (shift in [1, 31]).
WB_HOST_DEVICE uint32_t ShiftRoundEven(uint32_t sig, uint32_t shift) {
  uint32_t q = sig >> shift;
  uint32_t rem = sig & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return q;
}

// Round-to-nearest-even; overflow goes to +-Inf (IEEE: everything >= 65520 becomes Inf);
// NaN stays a quiet NaN with its sign; results below the f16 normal range become subnormals.
WB_HOST_DEVICE uint16_t F32ToF16(float f) {
  uint32_t u = FloatToBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x1ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: Inf
  if (a >= 0x38800000u) {                                              // f16 normal range
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r >> 13) - (112u << 10)));
  }
  // f16 subnormal: units of 2^-24. value = sig * 2^(e - 150), so units = sig >> (126 - e).
  uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to even 0)
  uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | ShiftRoundEven(sig, 126u - e));
}

// e4m3fn with saturation: round-to-nearest-even, |x| >= 448 (Inf included) -> +-448 (0x7e/0xfe),
// NaN -> 0x7f with the sign bit of the input, -0 -> 0x80.
WB_HOST_DEVICE uint8_t F32ToFp8E4M3Sat(float f) {
  uint32_t u = FloatToBits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | kFp8E4M3NanBits);
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | kFp8E4M3MaxBits);  // >= 448
  if (a >= 0x3c800000u) {  // >= 2^-6: e4m3 normal range, keep 3 mantissa bits
    uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    return static_cast<uint8_t>(sign | ((r >> 20) - (120u << 3)));
  }
  // Subnormal: units of 2^-9. value = sig * 2^(e - 150), units = sig >> (141 - e).
  uint32_t e = a >> 23;
  if (e < 116) return sign;  // below 2^-11: rounds to zero (2^-10 ties to even 0 below too)
  uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  return static_cast<uint8_t>(sign | ShiftRoundEven(sig, 141u - e));
}

// Exact: every e4m3fn value is an f32.
WB_HOST_DEVICE float Fp8E4M3ToF32(uint8_t v) {
  uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  uint32_t exp = (v >> 3) & 0xfu;
  uint32_t mant = v & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return BitsToFloat(sign | 0x7fc00000u);
  if (exp != 0) return BitsToFloat(sign | ((exp + 120u) << 23) | (mant << 20));
  if (mant == 0) return BitsToFloat(sign);
  uint32_t e = 121;  // subnormal: mant * 2^-9
  while ((mant & 0x8u) == 0) {
    mant <<= 1;
    --e;
  }
  return BitsToFloat(sign | (e << 23) | ((mant & 0x7u) << 20));
}

// |x| for the block amax: NaN and +-Inf are ignored (they count as 0), so one non-finite value
// does not wipe out the scale of the 16383 finite values around it.
WB_HOST_DEVICE float FiniteAbs(float x) {
  uint32_t a = FloatToBits(x) & 0x7fffffffu;
  return a >= 0x7f800000u ? 0.0f : BitsToFloat(a);
}

}  // namespace wb::transform::bits

#endif  // WB_DAEMON_TRANSFORM_FLOAT_BITS_H_
