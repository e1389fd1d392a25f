// AVX2 fp8 quantisation; on other architectures HaveAvx2() is false and the scalar
// fallbacks below are never called.
#include "daemon/transform/fp8_avx2.h"

#include <atomic>
#include <cstring>

#include "daemon/transform/float_bits.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define WB_HAVE_X86 1
#endif

namespace wb::transform {
namespace {

std::atomic<bool> avx2_allowed{true};

}  // namespace

void SetAvx2Allowed(bool allowed) { avx2_allowed.store(allowed); }

#if defined(WB_HAVE_X86)

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have && avx2_allowed.load(std::memory_order_relaxed);
}

__attribute__((target("avx2"))) uint16_t BlockAmaxBitsAvx2(const uint8_t* src, uint64_t stride,
                                                           uint64_t rows, uint64_t cols) {
  const __m256i abs_mask = _mm256_set1_epi16(0x7fff);
  const __m256i finite_limit = _mm256_set1_epi16(0x7f7f);  // a > 0x7f7f: Inf or NaN
  __m256i vmax = _mm256_setzero_si256();
  uint16_t amax = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    const uint8_t* row = src + r * stride;
    uint64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c));
      const __m256i a = _mm256_and_si256(v, abs_mask);
      // a <= 0x7fff, so the signed 16-bit compare is exact.
      const __m256i non_finite = _mm256_cmpgt_epi16(a, finite_limit);
      vmax = _mm256_max_epu16(vmax, _mm256_andnot_si256(non_finite, a));
    }
    for (; c < cols; ++c) {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      uint16_t a = h & 0x7fff;
      a = a >= 0x7f80 ? 0 : a;
      amax = a > amax ? a : amax;
    }
  }
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  for (uint16_t l : lanes) amax = l > amax ? l : amax;
  return amax;
}

__attribute__((target("avx2"))) void QuantizeRowSegmentAvx2(const uint8_t* src, uint8_t* dst,
                                                            uint64_t n, float scale) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i sign_byte = _mm256_set1_epi32(0x80);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i round_bias = _mm256_set1_epi32(0x7ffff);
  const __m256i rebias = _mm256_set1_epi32(120 << 3);
  const __m256 sub_magic = _mm256_set1_ps(16384.0f);  // ulp 2^-9: the e4m3 subnormal step
  const __m256i sub_magic_bits = _mm256_set1_epi32(0x46800000);
  const __m256i min_normal = _mm256_set1_epi32(0x3c800000);  // 2^-6
  const __m256i below_max = _mm256_set1_epi32(0x43dfffff);   // a > this: >= 448
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i max_code = _mm256_set1_epi32(bits::kFp8E4M3MaxBits);
  const __m256i nan_code = _mm256_set1_epi32(bits::kFp8E4M3NanBits);
  uint64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c));
    const __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    const __m256i u = _mm256_castps_si256(_mm256_div_ps(x, vscale));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), sign_byte);
    const __m256i a = _mm256_and_si256(u, abs_mask);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), one);
    const __m256i normal = _mm256_sub_epi32(
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, round_bias), odd), 20), rebias);
    const __m256i sub = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), sub_magic)), sub_magic_bits);
    // a <= 0x7fffffff, so signed 32-bit compares are exact.
    __m256i r = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(min_normal, a));
    r = _mm256_blendv_epi8(r, max_code, _mm256_cmpgt_epi32(a, below_max));
    r = _mm256_blendv_epi8(r, nan_code, _mm256_cmpgt_epi32(a, inf));
    r = _mm256_or_si256(r, sign);
    const __m128i words =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + c), _mm_packus_epi16(words, words));
  }
  for (; c < n; ++c) {
    uint16_t h;
    std::memcpy(&h, src + 2 * c, 2);
    dst[c] = bits::F32ToFp8E4M3Sat(bits::Bf16ToF32(h) / scale);
  }
}

#else

bool HaveAvx2() { return false; }
uint16_t BlockAmaxBitsAvx2(const uint8_t*, uint64_t, uint64_t, uint64_t) { return 0; }
void QuantizeRowSegmentAvx2(const uint8_t*, uint8_t*, uint64_t, float) {}

#endif

}  // namespace wb::transform
