// The reference tests compare FP8 destinations against: a BF16 matrix quantized to FP8 e4m3
// with float32 128x128 block scales by the CPU transform (daemon/transform), computed in the
// test from the trainer's bytes, independently of the plan and the agents that moved them.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>

#include "daemon/transform/transform.h"

namespace wb::testing {

// `bf16`: rows x cols BF16; `fp8`: rows x cols bytes; `scales`: ceil(rows/128) x ceil(cols/128).
inline void QuantizeFp8Blocks(const void* bf16, int64_t rows, int64_t cols, uint8_t* fp8,
                              float* scales) {
  wb::transform::TransformDesc d;
  d.kind = wb::transform::Kind::kFp8Block;
  d.src_dtype = wb::transform::DType::kBF16;
  d.dst_dtype = wb::transform::DType::kF8E4M3;
  d.rows = rows;
  d.cols = cols;
  REQUIRE(wb::transform::ApplyTransformCpu(d, bf16, fp8, scales, 1).ok());
}

}  // namespace wb::testing
