// The finiteness check a version's received bytes pass before it commits (VersionChecks.finite,
// issue 43): no NaN or Inf in a BF16, F16 or F32 destination, no NaN code in an FP8 e4m3fn one.
// Staged receivers check the staging mirror, so a version that fails never reaches the live
// tensors; in place the bytes are the live ones (the engine is just never told commit(v)).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "daemon/registry/region_registry.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::checks {

// The index of the first element of `elems` elements of `dtype` at `data` that is not finite,
// or none. Dtypes without non-finite values (integers) have none.
std::optional<uint64_t> FirstNonFinite(const void* data, uint64_t elems,
                                       weightbeam::v1::DType dtype);

struct FiniteStats {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Checks every tensor in `tensors` (their `memory`: the staging mirror when staged). Fails
// with FAILED_PRECONDITION naming the first tensor, element and bits that are not finite, or
// the tensor whose memory its owner shrank (the read is bus-guarded).
absl::Status CheckFinite(
    const std::vector<std::shared_ptr<const registry::RegisteredTensor>>& tensors,
    FiniteStats* stats);

}  // namespace wb::checks
