// Same-dtype copies on the CUDA transform path: contiguous rows go as one flat copy (any size,
// e.g. one row over 2 GiB, which cudaMemcpy2DAsync refuses), strided rows as one 2D copy while
// the pitches fit cudaMemcpy2D's limit, one copy per row beyond it.
#include "daemon/transform/copy_plan.h"

#include <catch2/catch.hpp>

namespace wb::transform {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST_CASE("a row over 2 GiB with stride == width is one flat copy") {
  const SameDtypeCopy plan = PlanSameDtypeCopy(1, 3 * kGiB, 3 * kGiB, 3 * kGiB);
  CHECK(plan.shape == CopyShape::kFlat);
  // Several contiguous rows of 3 GiB: still flat (stride 0 means contiguous, too).
  CHECK(PlanSameDtypeCopy(4, 3 * kGiB, 0, 0).shape == CopyShape::kFlat);
  CHECK(PlanSameDtypeCopy(4, 3 * kGiB, 3 * kGiB, 0).shape == CopyShape::kFlat);
}

TEST_CASE("strided rows under the pitch limit are one 2D copy") {
  const SameDtypeCopy plan = PlanSameDtypeCopy(8, 1024, 4096, 0);
  CHECK(plan.shape == CopyShape::kPitched);
  CHECK(plan.src_pitch == 4096);
  CHECK(plan.dst_pitch == 1024);
  CHECK(PlanSameDtypeCopy(8, 1024, kMaxCopyPitch, kMaxCopyPitch).shape == CopyShape::kPitched);
}

TEST_CASE("strided rows past the pitch limit are copied row by row") {
  CHECK(PlanSameDtypeCopy(3, kGiB, 3 * kGiB, 0).shape == CopyShape::kPerRow);
  CHECK(PlanSameDtypeCopy(3, kGiB, 0, kMaxCopyPitch + 1).shape == CopyShape::kPerRow);
  // The limit is a parameter (cudaDevAttrMaxPitch of the device).
  CHECK(PlanSameDtypeCopy(3, 16, 64, 0, /*max_pitch=*/32).shape == CopyShape::kPerRow);
  CHECK(PlanSameDtypeCopy(3, 16, 32, 0, /*max_pitch=*/32).shape == CopyShape::kPitched);
}

}  // namespace
}  // namespace wb::transform
