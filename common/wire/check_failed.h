// The words a receiving agent puts in a commit error when a version failed its checks
// (VersionChecks: finite, user). The controller reads them to refuse the version on every
// replica, rather than dropping only the replica that answered so (a lost agent is dropped).
#pragma once

#include <string_view>

namespace wb::wire {

inline constexpr char kCheckFailed[] = "failed its checks";

inline bool IsCheckFailure(std::string_view error) {
  return error.find(kCheckFailed) != std::string_view::npos;
}

}  // namespace wb::wire
