// The executor's Preparer on top of the transform library: copy needs no staging; casts and
// BF16 -> FP8 block quantization are computed into staging.
#pragma once

#include "daemon/executor/executor.h"

namespace wb::executor {

class OpPreparer : public Preparer {
 public:
  uint64_t StagingBytes(const weightbeam::v1::TransferOp& op) const override;
  absl::Status Prepare(const weightbeam::v1::TransferOp& op, const uint8_t* src,
                       uint8_t* staging) const override;
};

}  // namespace wb::executor
