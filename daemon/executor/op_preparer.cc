#include "daemon/executor/op_preparer.h"

#include "absl/strings/str_cat.h"
#include "daemon/registry/tensor_checks.h"

namespace wb::executor {

namespace v1 = weightbeam::v1;

uint64_t OpPreparer::StagingBytes(const v1::TransferOp& op) const {
  if (op.transform() == v1::TRANSFORM_COPY || op.transform() == v1::TRANSFORM_UNSPECIFIED) {
    return 0;
  }
  uint64_t bytes = op.rows() * op.row_elems() * registry::DTypeSize(op.dst_dtype());
  if (op.transform() == v1::TRANSFORM_FP8_BLOCK) {
    bytes += (op.rows() + 127) / 128 * ((op.row_elems() + 127) / 128) * sizeof(float);
  }
  return bytes;
}

absl::Status OpPreparer::Prepare(const v1::TransferOp& op, const uint8_t* src,
                                 uint8_t* staging) const {
  return absl::UnimplementedError(
      absl::StrCat("transform ", v1::Transform_Name(op.transform()), " is not wired yet"));
}

}  // namespace wb::executor
