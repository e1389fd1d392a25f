// Bridges the planner's wire TransferOp to a TransformDesc, so the agent's executor can run a
// planned operation with ApplyTransformCpu / ApplyTransformCuda.
#pragma once

#include "absl/status/statusor.h"
#include "daemon/transform/transform.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::transform {

absl::StatusOr<DType> DTypeFromProto(weightbeam::v1::DType dtype);

// Kind, dtypes, shape and strides of `op` (scale_stride from op.scale_stride()); validated.
absl::StatusOr<TransformDesc> DescFromTransferOp(const weightbeam::v1::TransferOp& op);

}  // namespace wb::transform
