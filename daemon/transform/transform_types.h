// Plain descriptor types of the transforms (no absl), shared by the host code and the CUDA
// kernels: what to convert, the block's shape and its strides.
#pragma once

#include <cstdint>

namespace wb::transform {

enum class DType { kF32, kF16, kBF16, kF8E4M3 };

enum class Kind {
  kCopy,             // same dtype, bytes as they are
  kCast,             // among f32 / bf16 / f16, round-to-nearest-even
  kFp8Block,         // bf16 -> fp8 e4m3fn, one float32 scale per 128x128 block
  kFp8BlockDequant,  // fp8 e4m3fn + block scales -> bf16 / f32 (verification)
};

constexpr int kFp8BlockSize = 128;

// A 2-D strided block: row r of the source starts at src + r * src_stride (bytes), row r of the
// destination at dst + r * dst_stride. For kFp8Block the scales form a
// ceil(rows/128) x ceil(cols/128) float32 grid, row i of it at scales + i * scale_stride; the
// block grid starts at element (0, 0) of the described block, so a caller that quantises a
// slice of a larger tensor must start the slice on a block boundary.
struct TransformDesc {
  Kind kind = Kind::kCopy;
  DType src_dtype = DType::kBF16;
  DType dst_dtype = DType::kBF16;
  uint64_t rows = 0;
  uint64_t cols = 0;
  uint64_t src_stride = 0;    // bytes; 0 means densely packed (cols * element size)
  uint64_t dst_stride = 0;    // bytes; 0 means densely packed
  uint64_t scale_stride = 0;  // bytes; 0 means densely packed (ceil(cols/128) * 4)
};

}  // namespace wb::transform
