// Validation of tensor specs against their memory: dtype, shape, shard slices, byte length.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::registry {

// Elements the buffer holds: the shard's volume, or the global shape's when not sharded.
uint64_t ShardElements(const weightbeam::v1::TensorSpec& spec);

// Checks name, dtype, shape and shard; then that `length` bytes hold exactly the shard.
// Every error names the tensor.
absl::Status ValidateTensorSpec(const weightbeam::v1::TensorSpec& spec, uint64_t length);

}  // namespace wb::registry
