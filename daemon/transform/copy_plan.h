// How the CUDA transform path copies rows of the same dtype (a plain header, host-tested):
// cudaMemcpy2DAsync refuses pitches above cudaDevAttrMaxPitch (2^31 - 1 bytes on every GPU
// CUDA 13 supports), so contiguous rows go as one flat copy whatever their size, strided rows
// as one 2D copy while both pitches fit, and as one copy per row beyond that (rows that long
// are few).
#pragma once

#include <algorithm>
#include <cstdint>

namespace wb::transform {

enum class CopyShape { kFlat, kPitched, kPerRow };

// The largest pitch cudaMemcpy2D accepts (cudaDevAttrMaxPitch).
constexpr uint64_t kMaxCopyPitch = (uint64_t{1} << 31) - 1;

struct SameDtypeCopy {
  CopyShape shape = CopyShape::kFlat;
  uint64_t src_pitch = 0;  // bytes from one row to the next (width when contiguous)
  uint64_t dst_pitch = 0;
};

// `width`: bytes per row; a stride of 0 (or one smaller than the row) means contiguous rows.
constexpr SameDtypeCopy PlanSameDtypeCopy(uint64_t rows, uint64_t width, uint64_t src_stride,
                                          uint64_t dst_stride, uint64_t max_pitch = kMaxCopyPitch) {
  SameDtypeCopy plan;
  plan.src_pitch = std::max(src_stride, width);
  plan.dst_pitch = std::max(dst_stride, width);
  if (rows <= 1 || (plan.src_pitch == width && plan.dst_pitch == width)) {
    plan.shape = CopyShape::kFlat;
  } else if (plan.src_pitch <= max_pitch && plan.dst_pitch <= max_pitch) {
    plan.shape = CopyShape::kPitched;
  } else {
    plan.shape = CopyShape::kPerRow;
  }
  return plan;
}

}  // namespace wb::transform
