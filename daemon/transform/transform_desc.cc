// Validation and geometry of TransformDesc, shared by the CPU and CUDA paths.
#include "absl/strings/str_cat.h"
#include "daemon/transform/transform.h"

namespace wb::transform {

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kCopy:
      return "copy";
    case Kind::kCast:
      return "cast";
    case Kind::kFp8Block:
      return "fp8_block";
    case Kind::kFp8BlockDequant:
      return "fp8_block_dequant";
  }
  return "?";
}

uint64_t ScaleRows(const TransformDesc& desc) {
  return (desc.rows + kFp8BlockSize - 1) / kFp8BlockSize;
}

uint64_t ScaleCols(const TransformDesc& desc) {
  return (desc.cols + kFp8BlockSize - 1) / kFp8BlockSize;
}

namespace {

bool IsCastable(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

std::string Describe(const TransformDesc& d) {
  return absl::StrCat(KindName(d.kind), " ", DTypeName(d.src_dtype), " -> ", DTypeName(d.dst_dtype),
                      " (", d.rows, "x", d.cols, ")");
}

}  // namespace

absl::Status ValidateDesc(TransformDesc& desc) {
  switch (desc.kind) {
    case Kind::kCopy:
      if (desc.src_dtype != desc.dst_dtype) {
        return absl::InvalidArgumentError(
            absl::StrCat("transform ", Describe(desc), ": copy needs equal dtypes"));
      }
      break;
    case Kind::kCast:
      if (!IsCastable(desc.src_dtype) || !IsCastable(desc.dst_dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat("transform ", Describe(desc), ": cast supports only f32 / f16 / bf16"));
      }
      break;
    case Kind::kFp8Block:
      if (desc.src_dtype != DType::kBF16 || desc.dst_dtype != DType::kF8E4M3) {
        return absl::InvalidArgumentError(
            absl::StrCat("transform ", Describe(desc), ": fp8_block needs bf16 -> f8_e4m3"));
      }
      break;
    case Kind::kFp8BlockDequant:
      if (desc.src_dtype != DType::kF8E4M3 ||
          (desc.dst_dtype != DType::kBF16 && desc.dst_dtype != DType::kF32)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "transform ", Describe(desc), ": fp8_block_dequant needs f8_e4m3 -> bf16 / f32"));
      }
      break;
  }
  const uint64_t src_row = desc.cols * ElementSize(desc.src_dtype);
  const uint64_t dst_row = desc.cols * ElementSize(desc.dst_dtype);
  if (desc.src_stride == 0) desc.src_stride = src_row;
  if (desc.dst_stride == 0) desc.dst_stride = dst_row;
  if (desc.scale_stride == 0) desc.scale_stride = ScaleCols(desc) * sizeof(float);
  if (desc.rows > 1 && desc.src_stride < src_row) {
    return absl::InvalidArgumentError(absl::StrCat("transform ", Describe(desc), ": src_stride ",
                                                   desc.src_stride, " < row size ", src_row));
  }
  if (desc.rows > 1 && desc.dst_stride < dst_row) {
    return absl::InvalidArgumentError(absl::StrCat("transform ", Describe(desc), ": dst_stride ",
                                                   desc.dst_stride, " < row size ", dst_row));
  }
  const bool uses_scales = desc.kind == Kind::kFp8Block || desc.kind == Kind::kFp8BlockDequant;
  if (uses_scales && ScaleRows(desc) > 1 && desc.scale_stride < ScaleCols(desc) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("transform ", Describe(desc), ": scale_stride ",
                                                   desc.scale_stride, " < scale row size ",
                                                   ScaleCols(desc) * 4));
  }
  if (uses_scales && desc.scale_stride % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("transform ", Describe(desc), ": scale_stride ",
                                                   desc.scale_stride, " is not a multiple of 4"));
  }
  return absl::OkStatus();
}

}  // namespace wb::transform
