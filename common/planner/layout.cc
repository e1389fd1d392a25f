#include "common/planner/layout.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::planner {

std::string FormatShape(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string FormatSlice(absl::Span<const DimSlice> shard, absl::Span<const int64_t> shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t start = shard.empty() ? 0 : (d < shard.size() ? shard[d].start : 0);
    int64_t size = shard.empty() ? shape[d] : (d < shard.size() ? shard[d].size : 0);
    absl::StrAppend(&out, d ? ", " : "", start, ":", start + size);
  }
  return out + "]";
}

std::string FormatOwner(const Owner& owner, const std::string& agent) {
  if (owner.role == Role::kTrainer) {
    if (owner.replica != 0) {
      return absl::StrCat("trainer replica ", owner.replica, " rank ", owner.rank, " on agent ",
                          agent);
    }
    return absl::StrCat("trainer rank ", owner.rank, " on agent ", agent);
  }
  return absl::StrCat("inference replica ", owner.replica, " rank ", owner.rank, " on agent ",
                      agent);
}

bool ParseLocation(const std::string& location, int32_t* gpu) {
  if (location == "host" || location.empty()) {
    *gpu = -1;
    return true;
  }
  if (location.rfind("cuda:", 0) != 0) return false;
  int32_t n = 0;
  if (!absl::SimpleAtoi(location.substr(5), &n) || n < 0) return false;
  *gpu = n;
  return true;
}

std::string FormatLocation(int32_t gpu) {
  return gpu < 0 ? std::string("host") : absl::StrCat("cuda:", gpu);
}

}  // namespace wb::planner
