// A planned TransferOp becomes the TransformDesc the executor runs, or a clear error.
#include "daemon/transform/transfer_op.h"

#include <catch2/catch.hpp>

namespace wb::transform {
namespace {

weightbeam::v1::TransferOp Fp8Op() {
  weightbeam::v1::TransferOp op;
  op.set_op_id(7);
  op.set_src_tensor("layers.0.mlp.w1");
  op.set_dst_tensor("layers.0.mlp.gate_up");
  op.set_transform(weightbeam::v1::TRANSFORM_FP8_BLOCK);
  op.set_src_dtype(weightbeam::v1::DTYPE_BF16);
  op.set_dst_dtype(weightbeam::v1::DTYPE_F8_E4M3);
  op.set_rows(256);
  op.set_row_elems(384);
  op.set_src_stride(1024);
  op.set_dst_stride(512);
  op.set_scale_stride(16);
  return op;
}

TEST_CASE("a TransferOp maps to a validated TransformDesc", "[transfer_op]") {
  absl::StatusOr<TransformDesc> d = DescFromTransferOp(Fp8Op());
  REQUIRE(d.ok());
  CHECK(d->kind == Kind::kFp8Block);
  CHECK(d->src_dtype == DType::kBF16);
  CHECK(d->dst_dtype == DType::kF8E4M3);
  CHECK(d->rows == 256);
  CHECK(d->cols == 384);
  CHECK(d->src_stride == 1024);
  CHECK(d->dst_stride == 512);
  CHECK(d->scale_stride == 16);
}

TEST_CASE("TransferOp errors name the op and its tensors", "[transfer_op]") {
  weightbeam::v1::TransferOp op = Fp8Op();
  op.set_src_stride(100);
  CHECK(DescFromTransferOp(op).status().message() ==
        "op 7 (layers.0.mlp.w1 -> layers.0.mlp.gate_up): transform fp8_block bf16 -> f8_e4m3 "
        "(256x384): src_stride 100 < row size 768");
  op = Fp8Op();
  op.set_src_dtype(weightbeam::v1::DTYPE_I64);
  CHECK(DescFromTransferOp(op).status().message() ==
        "op 7 (layers.0.mlp.w1 -> layers.0.mlp.gate_up): dtype DTYPE_I64 has no transform");
  op = Fp8Op();
  op.set_transform(weightbeam::v1::TRANSFORM_UNSPECIFIED);
  CHECK(DescFromTransferOp(op).status().message() ==
        "op 7 (layers.0.mlp.w1 -> layers.0.mlp.gate_up): transform TRANSFORM_UNSPECIFIED is not "
        "set");
}

}  // namespace
}  // namespace wb::transform
