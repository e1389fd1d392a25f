// Transfer operations the delta tests and the scatter benchmark build by hand: a strided copy
// and a ragged FP8 block-scaled cast, plus seeded random bytes to fill them with.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "common/tensor/dtype.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::testing {

// A copy of `rows` x `cols` elements of `dtype` into region 1 at `dst_offset`, each destination
// row `stride_pad` elements longer than the data.
inline weightbeam::v1::TransferOp StridedCopy(weightbeam::v1::DType dtype, uint64_t rows,
                                              uint64_t cols, uint64_t stride_pad,
                                              uint64_t dst_offset) {
  weightbeam::v1::TransferOp op;
  op.set_op_id(1);
  op.set_dst_tensor("model.layers.0.mlp.down_proj.weight");
  op.set_rows(rows);
  op.set_row_elems(cols);
  op.set_src_dtype(dtype);
  op.set_dst_dtype(dtype);
  op.set_transform(weightbeam::v1::TRANSFORM_COPY);
  op.set_dst_region(1);
  op.set_dst_offset(dst_offset);
  op.set_dst_stride((cols + stride_pad) * tensor::DTypeBytes(dtype));
  return op;
}

// BF16 -> FP8 e4m3 with 128x128 blocks, ragged unless rows and cols are multiples of 128: data
// into region 1 at `dst_offset`, rows `dst_stride` bytes apart (0: packed); one float scale per
// block into region 2 at 16, each row of scales one float longer than needed.
inline weightbeam::v1::TransferOp RaggedFp8(uint64_t rows, uint64_t cols, uint64_t dst_offset,
                                            uint64_t dst_stride) {
  weightbeam::v1::TransferOp op;
  op.set_op_id(2);
  op.set_dst_tensor("model.layers.0.self_attn.o_proj.weight");
  op.set_rows(rows);
  op.set_row_elems(cols);
  op.set_src_dtype(weightbeam::v1::DTYPE_BF16);
  op.set_dst_dtype(weightbeam::v1::DTYPE_F8_E4M3);
  op.set_transform(weightbeam::v1::TRANSFORM_FP8_BLOCK);
  op.set_dst_region(1);
  op.set_dst_offset(dst_offset);
  op.set_dst_stride(dst_stride);
  op.set_scale_region(2);
  op.set_scale_offset(16);
  op.set_scale_stride(((cols + 127) / 128 + 1) * 4);
  return op;
}

// `n` bytes from a generator seeded with `seed`: the same bytes every run.
inline std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace wb::testing
