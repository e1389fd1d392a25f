// receive.keep_versions (issue 43, instant rollback): the versions a staged receiver served
// before, kept in the agent's own memory, so that a replica goes back to one of them with one
// local copy and no byte crossing the network. Before each swap overwrites the live tensors,
// Save keeps what they hold (the version being replaced); Restore copies a kept version back
// into the live tensors. At most `keep` versions are kept, the oldest replaced first (its
// buffers reused), within `budget_bytes`.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/registry/region_registry.h"

namespace wb::staging {

class VersionHistory {
 public:
  using Tensors = std::vector<std::shared_ptr<const registry::RegisteredTensor>>;
  // `budget_bytes` 0: as much as `keep` versions need.
  VersionHistory(int keep, uint64_t budget_bytes);

  // Keeps what the live memory of the staged tensors in `tensors` holds now as `version`
  // (0: nothing committed yet, not kept). Over the budget, or on a tensor that cannot be
  // read, nothing of `version` is kept and the error says why (the swap goes on).
  absl::Status Save(uint64_t version, const Tensors& tensors);
  // Copies kept `version` into the live memory of `tensors`: NOT_FOUND naming the versions
  // kept; FAILED_PRECONDITION naming a tensor registered (or resized) since it was kept.
  absl::Status Restore(uint64_t version, const Tensors& tensors) const;
  // Kept versions, newest first.
  std::vector<uint64_t> Kept() const;
  std::string KeptText() const;  // "5, 4" or "none"
  // The bytes held for kept versions.
  uint64_t bytes() const;

 private:
  struct Saved {
    uint64_t version = 0;
    std::map<uint64_t, std::vector<uint8_t>> by_region;  // tensor region id -> its bytes
  };
  std::string KeptTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const int keep_;
  const uint64_t budget_;
  mutable absl::Mutex mu_;
  std::deque<Saved> kept_ ABSL_GUARDED_BY(mu_);  // newest first
};

}  // namespace wb::staging
