// Version identity (VersionChecks.digest, issue 43): a digest of what each (replica, rank) of an
// agent holds after a version lands, so that "which weights does replica 7 serve" has one
// answer. Per tensor, a 64-bit hash of its bytes (in kPieceBytes pieces, seeds chained, the same
// for host and GPU memory); per (replica, rank), a hash over its tensors' (name, hash) in name
// order. The controller combines a replica's ranks in rank order (controller/step_protocol.cc):
// replicas holding the same bytes under the same layout report the same digest.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/registry/region_registry.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::checks {

// One digest per (owner replica, owner rank) among the inference tensors in `tensors`.
absl::StatusOr<std::vector<weightbeam::v1::RankDigest>> DigestDestinations(
    const std::vector<std::shared_ptr<const registry::RegisteredTensor>>& tensors);

}  // namespace wb::checks
