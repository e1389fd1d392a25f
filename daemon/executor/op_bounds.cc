#include "daemon/executor/op_bounds.h"

#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "common/tensor/tensor_checks.h"

namespace wb::executor {

namespace v1 = weightbeam::v1;

namespace {

// Sizes above this are refused: sums and products of two such numbers cannot wrap.
constexpr uint64_t kLimit = uint64_t{1} << 62;

bool MulFits(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > kLimit / a) return false;
  *out = a * b;
  return *out <= kLimit;
}

}  // namespace

absl::Status CheckSourceOp(const v1::TransferOp& op, uint64_t source_length) {
  const uint64_t src_size = tensor::DTypeBytes(op.src_dtype());
  const uint64_t dst_size = tensor::DTypeBytes(op.dst_dtype());
  if (src_size == 0 || dst_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype (source ", static_cast<int>(op.src_dtype()), ", destination ",
                     static_cast<int>(op.dst_dtype()), ")"));
  }
  const bool copy =
      op.transform() == v1::TRANSFORM_COPY || op.transform() == v1::TRANSFORM_UNSPECIFIED;
  if (copy && src_size != dst_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("a copy from ", tensor::DTypeName(op.src_dtype()), " to ",
                     tensor::DTypeName(op.dst_dtype()), " changes the element size"));
  }
  if (op.rows() == 0 || op.row_elems() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty op: ", op.rows(), " rows of ", op.row_elems(), " elements"));
  }
  uint64_t src_row = 0, dst_row = 0, dst_total = 0;
  if (!MulFits(op.row_elems(), src_size, &src_row) ||
      !MulFits(op.row_elems(), dst_size, &dst_row) || !MulFits(dst_row, op.rows(), &dst_total)) {
    return absl::InvalidArgumentError(absl::StrCat(op.rows(), " rows of ", op.row_elems(),
                                                   " elements are too large (over 2^62 bytes)"));
  }
  const uint64_t stride = op.src_stride() ? op.src_stride() : src_row;
  if (op.rows() > 1 && stride < src_row) {
    return absl::InvalidArgumentError(
        absl::StrCat("source stride ", stride, " is shorter than a row (", src_row, " bytes)"));
  }
  uint64_t span = 0;  // (rows - 1) * stride + src_row, the bytes read from src_offset on
  if (!MulFits(op.rows() - 1, stride, &span) || (span += src_row) > kLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.rows(), " rows at stride ", stride, " span over 2^62 bytes"));
  }
  if (op.src_offset() > source_length || span > source_length - op.src_offset()) {
    return absl::OutOfRangeError(absl::StrCat("reads [", op.src_offset(), ", +", span,
                                              ") of a source region of ", source_length, " bytes"));
  }
  if (op.dst_stride() != 0 && op.dst_stride() > kLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination stride ", op.dst_stride(), " is over 2^62"));
  }
  return absl::OkStatus();
}

uint64_t SourceSpan(const v1::TransferOp& op) {
  const uint64_t row = op.row_elems() * tensor::DTypeBytes(op.src_dtype());
  const uint64_t stride = op.src_stride() ? op.src_stride() : row;
  return op.rows() == 0 ? 0 : (op.rows() - 1) * stride + row;
}

}  // namespace wb::executor
