#include "daemon/executor/op_preparer.h"

#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "daemon/transform/transform.h"

namespace wb::executor {

namespace v1 = weightbeam::v1;

namespace {

absl::StatusOr<transform::DType> ToTransformDType(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F32:
      return transform::DType::kF32;
    case v1::DTYPE_F16:
      return transform::DType::kF16;
    case v1::DTYPE_BF16:
      return transform::DType::kBF16;
    case v1::DTYPE_F8_E4M3:
      return transform::DType::kF8E4M3;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", tensor::DTypeName(d), " cannot be transformed"));
  }
}

}  // namespace

uint64_t OpPreparer::StagingBytes(const v1::TransferOp& op) const {
  if (op.transform() == v1::TRANSFORM_COPY || op.transform() == v1::TRANSFORM_UNSPECIFIED) {
    return 0;
  }
  uint64_t bytes = op.rows() * op.row_elems() * tensor::DTypeBytes(op.dst_dtype());
  if (op.transform() == v1::TRANSFORM_FP8_BLOCK) {
    bytes = Fp8ScaleOffset(bytes) +
            (op.rows() + 127) / 128 * ((op.row_elems() + 127) / 128) * sizeof(float);
  }
  return bytes;
}

absl::Status OpPreparer::Prepare(const v1::TransferOp& op, const uint8_t* src,
                                 uint8_t* staging) const {
  auto src_dtype = ToTransformDType(op.src_dtype());
  if (!src_dtype.ok()) return src_dtype.status();
  auto dst_dtype = ToTransformDType(op.dst_dtype());
  if (!dst_dtype.ok()) return dst_dtype.status();
  transform::TransformDesc desc;
  switch (op.transform()) {
    case v1::TRANSFORM_CAST:
      desc.kind = transform::Kind::kCast;
      break;
    case v1::TRANSFORM_FP8_BLOCK:
      desc.kind = transform::Kind::kFp8Block;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("transform ", v1::Transform_Name(op.transform()), " needs no staging"));
  }
  desc.src_dtype = *src_dtype;
  desc.dst_dtype = *dst_dtype;
  desc.rows = op.rows();
  desc.cols = op.row_elems();
  desc.src_stride = op.src_stride();
  desc.dst_stride = 0;  // dense rows in staging
  desc.scale_stride = 0;
  if (auto s = transform::ValidateDesc(desc); !s.ok()) return s;
  float* scales = nullptr;
  if (desc.kind == transform::Kind::kFp8Block) {
    scales = reinterpret_cast<float*>(staging + Fp8ScaleOffset(op.rows() * op.row_elems()));
  }
  // One thread per prepare worker: the executor already runs several in parallel.
  return transform::ApplyTransformCpu(desc, src + op.src_offset(), staging, scales, 1);
}

}  // namespace wb::executor
