// libFuzzer target for plan ops reaching a sending agent (daemon/executor/op_bounds.h): a
// TransferOp and a source region length from the input. An op the agent accepts has its rows
// read from a buffer of exactly that length the way the executor reads them (row by row at the
// source stride), so ASan reports any byte outside the region.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/tensor/dtype.h"
#include "common/tensor/tensor_checks.h"
#include "daemon/executor/op_bounds.h"
#include "weightbeam/v1/types.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // The first two bytes: the source region's length (up to 64 KiB).
  const uint64_t region = (uint64_t{data[0]} << 8 | data[1]) + 1;
  weightbeam::v1::TransferOp op;
  if (!op.ParseFromArray(data + 2, static_cast<int>(size - 2))) return 0;
  if (!wb::executor::CheckSourceOp(op, region).ok()) return 0;
  std::vector<uint8_t> src(region);
  const uint64_t row = op.row_elems() * wb::tensor::DTypeBytes(op.src_dtype());
  const uint64_t stride = op.src_stride() ? op.src_stride() : row;
  std::vector<uint8_t> out(row);
  for (uint64_t r = 0; r < op.rows(); ++r) {
    std::memcpy(out.data(), src.data() + op.src_offset() + r * stride, row);
  }
  return 0;
}
