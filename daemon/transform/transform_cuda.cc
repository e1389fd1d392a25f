// ApplyTransformCuda: validation and absl::Status around the kernel launchers.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/transform/cuda_kernels.h"
#include "daemon/transform/transform.h"

namespace wb::transform {
namespace {

bool Aligned(uint64_t value, uint64_t alignment) { return value % alignment == 0; }

}  // namespace

absl::Status ApplyTransformCuda(const TransformDesc& desc_in, const void* src, void* dst,
                                float* scales, void* stream) {
  TransformDesc desc = desc_in;
  if (absl::Status s = ValidateDesc(desc); !s.ok()) return s;
  const std::string what =
      absl::StrCat("transform ", KindName(desc.kind), " ", DTypeName(desc.src_dtype), " -> ",
                   DTypeName(desc.dst_dtype), " on CUDA");
  const bool uses_scales = desc.kind == Kind::kFp8Block || desc.kind == Kind::kFp8BlockDequant;
  if (desc.rows != 0 && desc.cols != 0) {
    if (src == nullptr || dst == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": null source or destination pointer"));
    }
    if (uses_scales && scales == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": needs a scales buffer"));
    }
    // The kernels load whole elements: pointers and strides must be element-aligned.
    const uint64_t src_size = ElementSize(desc.src_dtype);
    const uint64_t dst_size = ElementSize(desc.dst_dtype);
    if (!Aligned(reinterpret_cast<uintptr_t>(src), src_size) ||
        !Aligned(desc.src_stride, src_size) ||
        !Aligned(reinterpret_cast<uintptr_t>(dst), dst_size) ||
        !Aligned(desc.dst_stride, dst_size) ||
        (uses_scales && !Aligned(reinterpret_cast<uintptr_t>(scales), sizeof(float)))) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": pointers and strides must be aligned to the element size"));
    }
  }
  std::string error;
  switch (cuda::LaunchTransform(desc, src, dst, scales, stream, &error)) {
    case cuda::LaunchCode::kOk:
      return absl::OkStatus();
    case cuda::LaunchCode::kBuiltWithoutCuda:
    case cuda::LaunchCode::kNoDevice:
      return absl::FailedPreconditionError(absl::StrCat(what, ": ", error));
    case cuda::LaunchCode::kCudaError:
      break;
  }
  return absl::InternalError(absl::StrCat(what, ": ", error));
}

}  // namespace wb::transform
