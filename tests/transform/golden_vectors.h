// Golden vectors for the transforms, shared by the CPU test and the CUDA test. Expected bytes
// are derived by hand from the format definitions (not produced by the code under test).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace wb::transform::golden {

inline float F(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t U(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct F32ToByte {
  uint32_t f32_bits;
  uint8_t expected;
  const char* what;
};

// f32 -> e4m3fn (saturating, round-to-nearest-even). e4m3fn: bias 7, 3 mantissa bits,
// subnormals m * 2^-9, max 448 = 1.75 * 2^8 = 0x7e, 0x7f NaN.
inline const std::vector<F32ToByte>& Fp8Scalars() {
  static const std::vector<F32ToByte> v = {
      {0x3f800000, 0x38, "1.0: exponent 7, mantissa 0"},
      {0xbf800000, 0xb8, "-1.0"},
      {0x43e00000, 0x7e, "448: largest finite"},
      {0xc3e00000, 0xfe, "-448"},
      {0x43e80000, 0x7e, "464: halfway to the NaN code, saturates"},
      {0x4e6e6b28, 0x7e, "1e9: saturates"},
      {0x7f800000, 0x7e, "+Inf saturates to 448"},
      {0xff800000, 0xfe, "-Inf saturates to -448"},
      {0x7fc00000, 0x7f, "NaN -> 0x7f"},
      {0xffc00000, 0xff, "negative NaN keeps its sign"},
      {0x00000000, 0x00, "+0"},
      {0x80000000, 0x80, "-0 keeps its sign"},
      {0x3b000000, 0x01, "2^-9: smallest subnormal"},
      {0x3a800000, 0x00, "2^-10: tie between 0 and 2^-9 rounds to even 0"},
      {0x3a800001, 0x01, "just above 2^-10 rounds up to 2^-9"},
      {0x3b400000, 0x02, "1.5 * 2^-9: tie rounds to even 2 * 2^-9"},
      {0x3c600000, 0x07, "7 * 2^-9: largest subnormal"},
      {0x3c800000, 0x08, "2^-6: smallest normal"},
      {0x3c780000, 0x08, "7.75 * 2^-9 rounds up into the smallest normal"},
      {0x3f880000, 0x38, "1.0625: tie between 1.0 and 1.125 rounds to even 1.0"},
      {0x3f980000, 0x3a, "1.1875: tie between 1.125 and 1.25 rounds to even 1.25"},
      {0x3f900000, 0x39, "1.125"},
      {0x43700000, 0x77, "240 = 1.875 * 2^7"},
      {0x43800000, 0x78, "256 = 2^8"},
      {0x43d00000, 0x7d, "416 = 1.625 * 2^8"},
      {0x43d80000, 0x7e, "432: tie between 416 and 448 rounds to even 448"},
      {0x3f000000, 0x30, "0.5"},
      {0xc0000000, 0xc0, "-2.0"},
      {0x00000001, 0x00, "f32 denormal -> 0"},
  };
  return v;
}

struct F32ToHalf {
  uint32_t f32_bits;
  uint16_t expected;
  const char* what;
};

inline const std::vector<F32ToHalf>& Bf16Scalars() {
  static const std::vector<F32ToHalf> v = {
      {0x3f800000, 0x3f80, "1.0"},
      {0x3f808000, 0x3f80, "1 + 2^-8: tie rounds to even"},
      {0x3f818000, 0x3f82, "1 + 3 * 2^-8: tie rounds to even (up)"},
      {0x3f808001, 0x3f81, "just above the tie rounds up"},
      {0x80000000, 0x8000, "-0"},
      {0x7f800000, 0x7f80, "+Inf"},
      {0xff800000, 0xff80, "-Inf"},
      {0x7fa00000, 0x7fe0, "NaN stays NaN (quieted)"},
      {0x7f800001, 0x7fc0, "NaN with payload only in the low bits stays NaN"},
      {0x7f7fffff, 0x7f80, "largest f32 rounds up to Inf"},
      {0x00000001, 0x0000, "smallest f32 denormal rounds to 0"},
      {0x00010000, 0x0001, "f32 denormal kept as bf16 denormal"},
  };
  return v;
}

inline const std::vector<F32ToHalf>& F16Scalars() {
  static const std::vector<F32ToHalf> v = {
      {0x3f800000, 0x3c00, "1.0"},
      {0x477fe000, 0x7bff, "65504: largest finite"},
      {0x477fefff, 0x7bff, "just below 65520 rounds down"},
      {0x477ff000, 0x7c00, "65520: tie rounds to even -> Inf"},
      {0x4f000000, 0x7c00, "2^31 overflows to Inf"},
      {0xc7800000, 0xfc00, "-65536 overflows to -Inf"},
      {0x33800000, 0x0001, "2^-24: smallest subnormal"},
      {0x33000000, 0x0000, "2^-25: tie rounds to even 0"},
      {0x33400000, 0x0001, "1.5 * 2^-25 rounds up"},
      {0x38800000, 0x0400, "2^-14: smallest normal"},
      {0x387fe000, 0x0400, "1023.5 * 2^-24: tie rounds to even 1024 * 2^-24"},
      {0x3dcccccd, 0x2e66, "0.1"},
      {0x3f801000, 0x3c00, "1 + 2^-11: tie rounds to even"},
      {0x3f803000, 0x3c02, "1 + 3 * 2^-11: tie rounds to even (up)"},
      {0x80000000, 0x8000, "-0"},
      {0x7f800000, 0x7c00, "+Inf"},
      {0x7fc00000, 0x7e00, "NaN"},
      {0x322bcc77, 0x0000, "1e-8 underflows to 0"},
  };
  return v;
}

// A bf16 block with its hand-derived fp8 bytes and scale.
struct Fp8Block {
  const char* what;
  int rows;
  int cols;
  std::vector<uint16_t> bf16;  // row-major
  float scale;
  std::vector<uint8_t> expected;
};

inline const std::vector<Fp8Block>& Fp8Blocks() {
  static const std::vector<Fp8Block> v = {
      {"amax 448 gives scale 1: values quantise to themselves",
       2,
       4,
       {0x43e0 /*448*/, 0x3f80 /*1*/, 0xc000 /*-2*/, 0x0000, 0x3b00 /*2^-9*/, 0x7fc0 /*NaN*/,
        0x8000 /*-0*/, 0x3f88 /*1.0625: tie*/},
       1.0f,
       {0x7e, 0x38, 0xc0, 0x00, 0x01, 0x7f, 0x80, 0x38}},
      {"amax 896 gives scale 2; Inf is ignored for amax and saturates",
       1,
       5,
       {0x4460 /*896*/, 0x4000 /*2*/, 0x7f80 /*Inf*/, 0xff80 /*-Inf*/, 0xc2f0 /*-120*/},
       2.0f,
       {0x7e, 0x38, 0x7e, 0xfe, 0xe7 /*-60 = -1.875 * 2^5*/}},
      {"all-zero block gets scale 1 and zero bytes (sign kept)",
       2,
       2,
       {0x0000, 0x8000, 0x0000, 0x0000},
       1.0f,
       {0x00, 0x80, 0x00, 0x00}},
      {"only non-finite values: scale 1, Inf saturates, NaN stays NaN",
       1,
       3,
       {0x7f80, 0xffc0, 0xff80},
       1.0f,
       {0x7e, 0xff, 0xfe}},
      {"amax 7 gives scale 1/64: x / scale = 64 x",
       1,
       4,
       {0x40e0 /*7*/, 0x3f80 /*1*/, 0xbc00 /*-2^-7*/, 0x3c80 /*2^-6*/},
       0.015625f,
       {0x7e /*448*/, 0x68 /*64*/, 0xb0 /*-0.5*/, 0x38 /*1*/}},
  };
  return v;
}

// A ragged 2x3 block grid (130 x 260 elements): block (i, j) holds amax 448 * 2^(2i + j) at
// its first element and small powers of two elsewhere, so every expected byte and scale is
// exact. Fills `bf16` (row-major), `scales` (2 x 3) and `expected` fp8 bytes.
struct RaggedCase {
  int rows = 130;
  int cols = 260;
  std::vector<uint16_t> bf16;
  std::vector<float> scales;
  std::vector<uint8_t> expected;
};

inline RaggedCase MakeRaggedCase() {
  RaggedCase c;
  c.bf16.assign(c.rows * c.cols, 0);
  c.expected.assign(c.rows * c.cols, 0);
  c.scales.assign(2 * 3, 0.0f);
  for (int bi = 0; bi < 2; ++bi) {
    for (int bj = 0; bj < 3; ++bj) {
      const int k = 2 * bi + bj;  // scale = 2^k
      c.scales[bi * 3 + bj] = static_cast<float>(1 << k);
      for (int r = bi * 128; r < std::min(c.rows, bi * 128 + 128); ++r) {
        for (int col = bj * 128; col < std::min(c.cols, bj * 128 + 128); ++col) {
          const size_t idx = static_cast<size_t>(r) * c.cols + col;
          const bool first = r == bi * 128 && col == bj * 128;
          // 448 * 2^k = 1.75 * 2^(8 + k): bf16 exponent 135 + k, mantissa 0x60.
          // elsewhere +-2^k * 2^((r + col) % 8 - 4): quantises to +-2^((r + col) % 8 - 4).
          const int e = (r + col) % 8 - 4;
          const bool neg = (r + col) % 3 == 0;
          if (first) {
            c.bf16[idx] = static_cast<uint16_t>(((135 + k) << 7) | 0x60);
            c.expected[idx] = 0x7e;
          } else {
            c.bf16[idx] = static_cast<uint16_t>((neg ? 0x8000 : 0) | ((127 + k + e) << 7));
            c.expected[idx] = static_cast<uint8_t>((neg ? 0x80 : 0) | ((7 + e) << 3));
          }
        }
      }
    }
  }
  return c;
}

}  // namespace wb::transform::golden
