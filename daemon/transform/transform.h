// Element-wise transforms applied while weights move: copy, casts among f32 / bf16 / f16, and
// bf16 -> fp8 e4m3fn with 128x128 float32 block scales. Each works on a 2-D strided block (the
// planner's TransferOp: `rows` runs of `cols` elements), on the CPU or as a CUDA kernel, and
// the two produce identical bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "daemon/transform/transform_types.h"

namespace wb::transform {

size_t ElementSize(DType dtype);
const char* DTypeName(DType dtype);
const char* KindName(Kind kind);

// Checks dtypes against the kind, strides against row sizes; fills in zero strides.
absl::Status ValidateDesc(TransformDesc& desc);

uint64_t ScaleRows(const TransformDesc& desc);  // ceil(rows / 128)
uint64_t ScaleCols(const TransformDesc& desc);  // ceil(cols / 128)

// Runs the transform on host memory. `scales` is the output of kFp8Block and the input of
// kFp8BlockDequant, unused otherwise. `threads` = 0 picks the hardware concurrency; small
// blocks run on the calling thread.
//
// Number handling (identical on the GPU):
// - casts round to nearest even; NaN stays a quiet NaN with its sign; f32 / bf16 -> f16
//   overflow (|x| >= 65520) becomes +-Inf as IEEE prescribes; f32 -> bf16 past the largest
//   bf16 likewise becomes +-Inf.
// - kFp8Block: amax = max |x| over the finite values of the block (NaN and +-Inf are ignored);
//   scale = amax / 448 (float32 division), stored as float32 (DeepSeek-V3 / Kimi-K2
//   `weight_scale_inv`: dequantised value = fp8 * scale). A block without a nonzero finite
//   value gets scale 1.0 (never 0: consumers that multiply by 1/scale stay finite; the
//   dequantised zeros are exact either way) and its zeros quantise to 0x00 (0x80 for -0).
//   Unlike DeepGEMM's per_block_cast_to_fp8 there is no amax floor of 1e-4: tiny blocks keep
//   their full fp8 resolution. Each element is
//   q = x / scale (float32 division, round-to-nearest-even), then rounded to nearest even
//   e4m3fn and saturated to [-448, 448]: +-Inf -> +-448 (0x7e / 0xfe), NaN -> 0x7f / 0xff
//   (sign kept). Denormal bf16 inputs take part like any other value: a block whose amax is
//   denormal gets a denormal float32 scale, and the divisions keep denormals on both sides
//   (nvcc -ftz=false; the host must not run with FTZ/DAZ set, i.e. no -ffast-math binary).
// - kFp8BlockDequant: fp8 * scale as a float32 product, then rounded to bf16 if asked.
absl::Status ApplyTransformCpu(const TransformDesc& desc, const void* src, void* dst,
                               float* scales = nullptr, int threads = 0);

// The same on device memory, enqueued on `stream` (a cudaStream_t; nullptr = default stream).
// Returns FailedPrecondition "built without CUDA" or "no CUDA device" where it cannot run.
absl::Status ApplyTransformCuda(const TransformDesc& desc, const void* src, void* dst,
                                float* scales = nullptr, void* stream = nullptr);

}  // namespace wb::transform
