// CPU transforms against hand-derived golden vectors, exhaustive round trips and an
// independent f16 reference (the compiler's _Float16 conversion).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "daemon/transform/float_bits.h"
#include "daemon/transform/fp8_avx2.h"
#include "daemon/transform/transform.h"
#include "tests/transform/golden_vectors.h"

namespace wb::transform {
namespace {

using golden::F;
using golden::U;

// Independent reference conversions written with integer shifts (the library uses float-add
// rounding for subnormals and selects instead of branches).
uint32_t ShiftRoundEven(uint32_t sig, uint32_t shift) {
  uint32_t q = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return q;
}

uint8_t ReferenceFp8(float f) {
  const uint32_t u = U(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;
  if (a >= 0x43e00000u) return sign | 0x7e;
  if (a >= 0x3c800000u) {
    const uint32_t e = (a >> 23) - 120, m = ShiftRoundEven((a & 0x7fffffu) | 0x800000u, 20);
    return static_cast<uint8_t>(sign | ((e << 3) + m - 8));  // m in [8, 16]: carry into e
  }
  const uint32_t e = a >> 23;
  if (e < 116) return sign;
  return static_cast<uint8_t>(sign | ShiftRoundEven((a & 0x7fffffu) | 0x800000u, 141u - e));
}

uint16_t ReferenceF16(float f) {
  const uint32_t u = U(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00 | ((a >> 13) & 0x1ff);
  if (a >= 0x477ff000u) return sign | 0x7c00;
  if (a >= 0x38800000u) {
    const uint32_t e = (a >> 23) - 112, m = ShiftRoundEven((a & 0x7fffffu) | 0x800000u, 13);
    return static_cast<uint16_t>(sign | ((e << 10) + m - 1024));
  }
  const uint32_t e = a >> 23;
  if (e < 102) return sign;
  return static_cast<uint16_t>(sign | ShiftRoundEven((a & 0x7fffffu) | 0x800000u, 126u - e));
}

TEST_CASE("fp8 and f16 narrowing agree with shift-based references on a bit-pattern sweep",
          "[fp8][cast]") {
  for (uint64_t u = 0; u <= 0xffffffffull; u += 251) {
    const float f = F(static_cast<uint32_t>(u));
    if (bits::F32ToFp8E4M3Sat(f) != ReferenceFp8(f)) FAIL("fp8 of f32 bits " << u);
    if (bits::F32ToF16(f) != ReferenceF16(f)) FAIL("f16 of f32 bits " << u);
  }
  // Dense around the subnormal / normal boundaries, where rounding is most delicate.
  for (uint32_t base : {0x3a000000u, 0x3b000000u, 0x3c000000u, 0x3c800000u, 0x33000000u,
                        0x38000000u, 0x38800000u, 0x43d00000u, 0x477f0000u}) {
    for (uint32_t d = 0; d < (1u << 20); d += 7) {
      const float f = F(base + d);
      if (bits::F32ToFp8E4M3Sat(f) != ReferenceFp8(f)) FAIL("fp8 of f32 bits " << base + d);
      if (bits::F32ToF16(f) != ReferenceF16(f)) FAIL("f16 of f32 bits " << base + d);
    }
  }
}

TEST_CASE("f32 -> fp8 e4m3fn matches hand-derived bytes", "[fp8]") {
  for (const auto& g : golden::Fp8Scalars()) {
    INFO(g.what);
    CHECK(static_cast<int>(bits::F32ToFp8E4M3Sat(F(g.f32_bits))) == g.expected);
  }
}

TEST_CASE("f32 -> bf16 and f32 -> f16 match hand-derived bits", "[cast]") {
  for (const auto& g : golden::Bf16Scalars()) {
    INFO(g.what);
    CHECK(bits::F32ToBf16(F(g.f32_bits)) == g.expected);
  }
  for (const auto& g : golden::F16Scalars()) {
    INFO(g.what);
    CHECK(bits::F32ToF16(F(g.f32_bits)) == g.expected);
  }
}

TEST_CASE("every fp8, bf16 and f16 value survives widening and narrowing", "[cast]") {
  for (int v = 0; v < 256; ++v) {
    const float f = bits::Fp8E4M3ToF32(static_cast<uint8_t>(v));
    if ((v & 0x7f) == 0x7f) {
      CHECK(std::isnan(f));
      CHECK(bits::F32ToFp8E4M3Sat(f) == v);  // the sign of NaN is kept
    } else {
      INFO("fp8 " << v);
      CHECK(bits::F32ToFp8E4M3Sat(f) == v);
    }
  }
  for (uint32_t v = 0; v < 65536; ++v) {
    const uint16_t h = static_cast<uint16_t>(v);
    const bool bf16_nan = (h & 0x7fff) > 0x7f80;
    const bool f16_nan = (h & 0x7fff) > 0x7c00;
    if (bf16_nan) {
      CHECK(std::isnan(bits::Bf16ToF32(h)));
    } else if (bits::F32ToBf16(bits::Bf16ToF32(h)) != h) {
      FAIL("bf16 round trip of " << h);
    }
    if (f16_nan) {
      CHECK(std::isnan(bits::F16ToF32(h)));
    } else if (bits::F32ToF16(bits::F16ToF32(h)) != h) {
      FAIL("f16 round trip of " << h);
    }
  }
}

TEST_CASE("f16 widening agrees with the compiler's _Float16", "[cast]") {
  for (uint32_t v = 0; v < 65536; ++v) {
    const uint16_t h = static_cast<uint16_t>(v);
    if ((h & 0x7fff) > 0x7c00) continue;
    _Float16 x;
    std::memcpy(&x, &h, 2);
    if (U(bits::F16ToF32(h)) != U(static_cast<float>(x))) FAIL("f16 " << h);
  }
}

TEST_CASE("f32 -> f16 agrees with the compiler's _Float16 on a sweep of bit patterns", "[cast]") {
  // Every 509th pattern plus the neighbours of every f16 rounding boundary region.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 509) {
    const float f = F(static_cast<uint32_t>(u));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    if (bits::F32ToF16(f) != ref_bits) FAIL("f32 bits " << u);
  }
}

TEST_CASE("fp8 block quantisation matches golden blocks", "[fp8]") {
  for (const auto& g : golden::Fp8Blocks()) {
    INFO(g.what);
    TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, static_cast<uint64_t>(g.rows),
                    static_cast<uint64_t>(g.cols)};
    std::vector<uint8_t> out(g.rows * g.cols, 0xaa);
    float scale = -1.0f;
    REQUIRE(ApplyTransformCpu(d, g.bf16.data(), out.data(), &scale).ok());
    CHECK(U(scale) == U(g.scale));
    CHECK(out == g.expected);
  }
}

TEST_CASE("fp8 quantisation of ragged blocks with padded strides", "[fp8]") {
  const golden::RaggedCase c = golden::MakeRaggedCase();
  // Source rows padded by 6 elements, destination rows by 3 bytes, scale rows by 1 float.
  const uint64_t src_stride = (c.cols + 6) * 2, dst_stride = c.cols + 3, scale_stride = 16;
  std::vector<uint8_t> src(c.rows * src_stride, 0xff);  // padding is NaN: must be ignored
  for (int r = 0; r < c.rows; ++r) {
    std::memcpy(src.data() + r * src_stride, c.bf16.data() + r * c.cols, c.cols * 2);
  }
  std::vector<uint8_t> dst(c.rows * dst_stride, 0x5a);
  std::vector<float> scales(2 * 4, -7.0f);
  for (int threads : {1, 2, 3}) {
    TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, 130, 260,
                    src_stride,      dst_stride,   scale_stride};
    REQUIRE(ApplyTransformCpu(d, src.data(), dst.data(), scales.data(), threads).ok());
    for (int r = 0; r < c.rows; ++r) {
      REQUIRE(std::memcmp(dst.data() + r * dst_stride, c.expected.data() + r * c.cols, c.cols) ==
              0);
      REQUIRE(dst[r * dst_stride + c.cols] == 0x5a);  // padding untouched
    }
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j) CHECK(scales[i * 4 + j] == c.scales[i * 3 + j]);
      CHECK(scales[i * 4 + 3] == -7.0f);
    }
  }
}

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bits::F32ToBf16(normal(rng));
  // Sprinkle specials: NaN, +-Inf, denormals, large values, -0.
  const uint16_t specials[] = {0x7fc0, 0x7f80, 0xff80, 0x0001, 0x8003, 0x4780, 0xc7a0, 0x8000};
  for (size_t i = 0; i < n; i += 997) v[i] = specials[(i / 997) % 8];
  return v;
}

TEST_CASE("fp8 quantisation: threads do not change bytes, dequantisation is close", "[fp8]") {
  // Once with the AVX2 loops (where the CPU has them), once with the scalar fallback.
  const bool avx2 = GENERATE(true, false);
  INFO("avx2 allowed: " << avx2);
  SetAvx2Allowed(avx2);
  const uint64_t rows = 515, cols = 700;
  const std::vector<uint16_t> src = RandomBf16(rows * cols, 7);
  TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, rows, cols};
  std::vector<uint8_t> one(rows * cols), many(rows * cols);
  std::vector<float> s1(5 * 6), s4(5 * 6);
  REQUIRE(ApplyTransformCpu(d, src.data(), one.data(), s1.data(), 1).ok());
  REQUIRE(ApplyTransformCpu(d, src.data(), many.data(), s4.data(), 4).ok());
  CHECK(one == many);
  CHECK(s1 == s4);

  // Against the scalar definition, element by element (the library may run AVX2 loops).
  for (uint64_t i = 0; i < rows * cols; ++i) {
    const float scale = s1[(i / cols / 128) * 6 + (i % cols) / 128];
    if (one[i] != bits::F32ToFp8E4M3Sat(bits::Bf16ToF32(src[i]) / scale)) FAIL("element " << i);
  }
  for (uint64_t br = 0; br < 5; ++br) {
    for (uint64_t bc = 0; bc < 6; ++bc) {
      float amax = 0;
      for (uint64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
        for (uint64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
          const float x = std::fabs(bits::Bf16ToF32(src[r * cols + c]));
          if (std::isfinite(x)) amax = std::max(amax, x);
        }
      }
      CHECK(s1[br * 6 + bc] == (amax > 0 ? amax / 448.0f : 1.0f));
    }
  }
  SetAvx2Allowed(true);

  TransformDesc back{Kind::kFp8BlockDequant, DType::kF8E4M3, DType::kF32, rows, cols};
  std::vector<float> deq(rows * cols);
  REQUIRE(ApplyTransformCpu(back, one.data(), deq.data(), s1.data()).ok());
  for (uint64_t i = 0; i < rows * cols; ++i) {
    const float x = bits::Bf16ToF32(src[i]);
    const float scale = s1[(i / cols / 128) * 6 + (i % cols) / 128];
    if (std::isnan(x)) {
      REQUIRE(std::isnan(deq[i]));
    } else if (std::isinf(x)) {
      REQUIRE(deq[i] == std::copysign(448.0f * scale, x));
    } else {
      // e4m3: relative error <= 2^-4 for normals, absolute <= 2^-10 * scale for subnormals.
      REQUIRE(std::fabs(deq[i] - x) <= std::max(std::fabs(x) / 16, scale / 1024) * 1.0001f);
    }
  }
}

TEST_CASE("dequantisation to bf16 of hand-derived bytes", "[fp8]") {
  const std::vector<uint8_t> q = {0x38, 0x7e, 0xc0, 0x01, 0x80, 0x7f};
  const float scale = 2.0f;
  std::vector<uint16_t> out(q.size());
  TransformDesc d{Kind::kFp8BlockDequant, DType::kF8E4M3, DType::kBF16, 1, q.size()};
  REQUIRE(ApplyTransformCpu(d, q.data(), out.data(), const_cast<float*>(&scale)).ok());
  CHECK(out[0] == 0x4000);  // 1 * 2
  CHECK(out[1] == 0x4460);  // 448 * 2 = 896
  CHECK(out[2] == 0xc080);  // -2 * 2
  CHECK(out[3] == 0x3b80);  // 2^-9 * 2 = 2^-8
  CHECK(out[4] == 0x8000);  // -0
  CHECK((out[5] & 0x7fff) > 0x7f80);
}

TEST_CASE("casts with strides convert every element and leave padding alone", "[cast]") {
  const uint64_t rows = 37, cols = 129;
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> any;
  std::vector<uint32_t> f32(rows * (cols + 1));
  for (auto& x : f32) x = any(rng);
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (DType mid : {DType::kF16, DType::kBF16}) {
    INFO("f32 -> " << DTypeName(mid) << " -> each type");
    // f32 -> mid with a padded source.
    std::vector<uint16_t> half(rows * cols);
    TransformDesc d{Kind::kCast, DType::kF32, mid, rows, cols, (cols + 1) * 4, 0};
    REQUIRE(ApplyTransformCpu(d, f32.data(), half.data(), nullptr, 3).ok());
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < cols; ++c) {
        const float x = F(f32[r * (cols + 1) + c]);
        const uint16_t want = mid == DType::kF16 ? bits::F32ToF16(x) : bits::F32ToBf16(x);
        if (half[r * cols + c] != want) FAIL("row " << r << " col " << c);
      }
    }
    for (DType out : types) {
      std::vector<uint8_t> dst(rows * (cols * 4 + 8), 0xee);
      const uint64_t dst_stride = cols * ElementSize(out) + 8;
      TransformDesc e{mid == out ? Kind::kCopy : Kind::kCast, mid, out, rows, cols, 0, dst_stride};
      REQUIRE(ApplyTransformCpu(e, half.data(), dst.data()).ok());
      for (uint64_t r = 0; r < rows; ++r) {
        REQUIRE(dst[r * dst_stride + cols * ElementSize(out)] == 0xee);
        for (uint64_t c = 0; c < cols; ++c) {
          const uint16_t h = half[r * cols + c];
          const float x = mid == DType::kF16 ? bits::F16ToF32(h) : bits::Bf16ToF32(h);
          const uint8_t* p = dst.data() + r * dst_stride + c * ElementSize(out);
          if (out == DType::kF32) {
            uint32_t got;
            std::memcpy(&got, p, 4);
            if (got != U(x) && !std::isnan(x)) FAIL("to f32 row " << r << " col " << c);
          } else {
            uint16_t got;
            std::memcpy(&got, p, 2);
            const uint16_t want = out == DType::kF16 ? bits::F32ToF16(x) : bits::F32ToBf16(x);
            if (got != want && !(out == mid && got == h)) FAIL("row " << r << " col " << c);
          }
        }
      }
    }
  }
}

TEST_CASE("invalid descriptors are refused with the reason", "[api]") {
  uint8_t buf[64] = {};
  float scale = 0;
  TransformDesc copy{Kind::kCopy, DType::kBF16, DType::kF16, 1, 4};
  CHECK(ApplyTransformCpu(copy, buf, buf).message() ==
        "transform copy bf16 -> f16 (1x4): copy needs equal dtypes");
  TransformDesc fp8{Kind::kFp8Block, DType::kF32, DType::kF8E4M3, 1, 4};
  CHECK(ApplyTransformCpu(fp8, buf, buf, &scale).message() ==
        "transform fp8_block f32 -> f8_e4m3 (1x4): fp8_block needs bf16 -> f8_e4m3");
  TransformDesc narrow{Kind::kCast, DType::kF32, DType::kBF16, 2, 8, 16, 0};
  CHECK(ApplyTransformCpu(narrow, buf, buf).message() ==
        "transform cast f32 -> bf16 (2x8): src_stride 16 < row size 32");
  TransformDesc no_scales{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, 1, 4};
  CHECK(ApplyTransformCpu(no_scales, buf, buf).message() ==
        "transform fp8_block: needs a scales buffer");
  TransformDesc fp8_cast{Kind::kCast, DType::kBF16, DType::kF8E4M3, 1, 4};
  CHECK(absl::IsInvalidArgument(ApplyTransformCpu(fp8_cast, buf, buf)));
}

TEST_CASE("fp8: one op of many tiles lands the bytes of one op per tile", "[fp8]") {
  // A coalesced planner op (a row-parallel TP shard of a whole source tensor): 512 x 256
  // elements read from a 1024-column source at column 384, written into a buffer 320 columns
  // wide at column 64, scales into a scale buffer 3 floats wide at column 1. Once as one op,
  // once as the 8 single-tile ops that the block-by-block cut gave: every byte must agree.
  const uint64_t rows = 512, cols = 256, src_cols = 1024, dst_cols = 320, scale_cols = 3;
  const std::vector<uint16_t> src = RandomBf16(rows * src_cols, 7);
  const uint8_t* s0 = reinterpret_cast<const uint8_t*>(src.data()) + 384 * 2;
  const int threads = GENERATE(1, 3);
  std::vector<uint8_t> whole(rows * dst_cols, 0x5a), tiles(rows * dst_cols, 0x5a);
  std::vector<float> whole_scales(4 * scale_cols, -7.0f), tile_scales(4 * scale_cols, -7.0f);
  TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, rows, cols,
                  src_cols * 2,    dst_cols,     scale_cols * 4};
  REQUIRE(ApplyTransformCpu(d, s0, whole.data() + 64, whole_scales.data() + 1, threads).ok());
  for (uint64_t br = 0; br < rows / 128; ++br) {
    for (uint64_t bc = 0; bc < cols / 128; ++bc) {
      TransformDesc t = d;
      t.rows = t.cols = 128;
      REQUIRE(ApplyTransformCpu(t, s0 + (br * 128 * src_cols + bc * 128) * 2,
                                tiles.data() + br * 128 * dst_cols + 64 + bc * 128,
                                tile_scales.data() + br * scale_cols + 1 + bc, threads)
                  .ok());
    }
  }
  CHECK(whole == tiles);
  for (size_t i = 0; i < whole_scales.size(); ++i) CHECK(U(whole_scales[i]) == U(tile_scales[i]));
  // Outside the op: untouched.
  CHECK(whole[0] == 0x5a);
  CHECK(whole_scales[0] == -7.0f);
  CHECK(whole_scales[3] == -7.0f);
}

}  // namespace
}  // namespace wb::transform
