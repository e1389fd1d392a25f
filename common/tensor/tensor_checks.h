// Validation of tensor specs against their memory: dtype, shape, shard slices, byte length.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::registry {

// Elements the buffer holds: the shard's volume, or the global shape's when not sharded.
uint64_t ShardElements(const weightbeam::v1::TensorSpec& spec);

// Checks name, dtype, shape and shard; then that `length` bytes hold exactly the shard, or,
// for a spec with a view, exactly the view's buffer with the shard inside it (shard rank <=
// buffer rank, offsets in range). Every error names the tensor (and the buffer).
absl::Status ValidateTensorSpec(const weightbeam::v1::TensorSpec& spec, uint64_t length);

// Whether two valid specs with views onto the same buffer share an element of it.
bool ViewPartsOverlap(const weightbeam::v1::TensorSpec& a, const weightbeam::v1::TensorSpec& b);

}  // namespace wb::registry
