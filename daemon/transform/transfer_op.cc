// TransferOp -> TransformDesc.
#include "daemon/transform/transfer_op.h"

#include "absl/strings/str_cat.h"

namespace wb::transform {

static_assert(static_cast<int>(DType::kF32) == weightbeam::v1::DTYPE_F32 &&
                  static_cast<int>(DType::kF16) == weightbeam::v1::DTYPE_F16 &&
                  static_cast<int>(DType::kBF16) == weightbeam::v1::DTYPE_BF16 &&
                  static_cast<int>(DType::kF8E4M3) == weightbeam::v1::DTYPE_F8_E4M3,
              "transform::DType's values index common/tensor/dtype.h");

absl::StatusOr<DType> DTypeFromProto(weightbeam::v1::DType dtype) {
  switch (dtype) {
    case weightbeam::v1::DTYPE_F32:
      return DType::kF32;
    case weightbeam::v1::DTYPE_F16:
      return DType::kF16;
    case weightbeam::v1::DTYPE_BF16:
      return DType::kBF16;
    case weightbeam::v1::DTYPE_F8_E4M3:
      return DType::kF8E4M3;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", weightbeam::v1::DType_Name(dtype), " has no transform"));
  }
}

absl::StatusOr<TransformDesc> DescFromTransferOp(const weightbeam::v1::TransferOp& op) {
  const std::string where =
      absl::StrCat("op ", op.op_id(), " (", op.src_tensor(), " -> ", op.dst_tensor(), "): ");
  TransformDesc d;
  switch (op.transform()) {
    case weightbeam::v1::TRANSFORM_COPY:
      d.kind = Kind::kCopy;
      break;
    case weightbeam::v1::TRANSFORM_CAST:
      d.kind = Kind::kCast;
      break;
    case weightbeam::v1::TRANSFORM_FP8_BLOCK:
      d.kind = Kind::kFp8Block;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          where, "transform ", weightbeam::v1::Transform_Name(op.transform()), " is not set"));
  }
  absl::StatusOr<DType> src = DTypeFromProto(op.src_dtype());
  absl::StatusOr<DType> dst = DTypeFromProto(op.dst_dtype());
  if (!src.ok()) return absl::InvalidArgumentError(absl::StrCat(where, src.status().message()));
  if (!dst.ok()) return absl::InvalidArgumentError(absl::StrCat(where, dst.status().message()));
  d.src_dtype = *src;
  d.dst_dtype = *dst;
  d.rows = op.rows();
  d.cols = op.row_elems();
  d.src_stride = op.src_stride();
  d.dst_stride = op.dst_stride();
  d.scale_stride = op.scale_stride();
  if (absl::Status s = ValidateDesc(d); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
  }
  return d;
}

}  // namespace wb::transform
