// The words a receiving agent puts in a commit error when a version failed its checks
// (VersionChecks: finite, user). The controller reads them to refuse the version on every
// replica, rather than dropping only the replica that answered so (a lost agent is dropped).
#pragma once

#include <chrono>
#include <string_view>

#include "weightbeam/v1/types.pb.h"

namespace wb::wire {

inline constexpr char kCheckFailed[] = "failed its checks";

inline bool IsCheckFailure(std::string_view error) {
  return error.find(kCheckFailed) != std::string_view::npos;
}

// VersionChecks.user_deadline_ms, 0 reading as 10 s: how long an agent waits for its check
// watchers (and the controller's commit call waits longer by as much).
inline std::chrono::milliseconds UserCheckDeadline(const weightbeam::v1::VersionChecks& c) {
  return std::chrono::milliseconds(c.user_deadline_ms() > 0 ? c.user_deadline_ms() : 10000);
}

}  // namespace wb::wire
