// VersionChecks.user (issue 43): before a staged version is committed, the check watchers
// (WatchEventsRequest.check) of every user whose tensors it writes hear check(v) with their own
// user's staging objects, look at the staged bytes (a smoke forward, a norm bound, ...) and
// answer with AckVersion{check: true}. The version is refused, naming the watcher, when one
// answers with an error, misses the deadline, stops watching first, or when a user whose
// tensors it writes has no check watcher at all (nothing unchecked goes live).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/staging/ack_book.h"
#include "daemon/staging/staged_swap.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::staging {

struct UserCheckEnvironment {
  std::function<SwapEnvironment::Tensors()> destinations;
  std::function<void(const weightbeam::v1::Event&)> publish;
  std::function<std::vector<weightbeam::v1::StagedObject>(std::optional<uid_t> owner)>
      staged_objects;
};

// The book of check watchers: errors worded as refusals, a watcher that leaves fails the check.
AckBook::Options CheckBookOptions();

// Runs the user check of `version` (its bytes staged, not live): OK when every check watcher
// chosen accepted it within `deadline`; FailedPrecondition naming why not.
absl::Status RunUserCheck(AckBook* checks, const UserCheckEnvironment& env, uint64_t version,
                          std::chrono::milliseconds deadline);

}  // namespace wb::staging
