// AVX2 versions of the fp8 block quantiser's two hot loops (block amax, row quantisation).
// They compute exactly what the scalar code in float_bits.h computes (same IEEE division,
// same integer rounding), eight elements at a time; callers pick them when HaveAvx2().
#pragma once

#include <cstdint>

namespace wb::transform {

// True when the CPU has AVX2 and it has not been switched off with SetAvx2Allowed(false).
bool HaveAvx2();

// Tests use this to run the scalar fallback on AVX2 machines.
void SetAvx2Allowed(bool allowed);

// Largest finite |x| of a bf16 block, as bf16 bits (NaN and Inf count as 0).
uint16_t BlockAmaxBitsAvx2(const uint8_t* src, uint64_t stride, uint64_t rows, uint64_t cols);

// dst[c] = F32ToFp8E4M3Sat(Bf16ToF32(src[c]) / scale) for c < n.
void QuantizeRowSegmentAvx2(const uint8_t* src, uint8_t* dst, uint64_t n, float scale);

}  // namespace wb::transform
