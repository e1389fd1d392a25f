#include "daemon/executor/tensor_filter.h"

#include <fnmatch.h>

#include <utility>

namespace wb::executor {

namespace {

bool AnyMatches(const std::vector<std::string>& patterns, const std::string& name) {
  for (const std::string& p : patterns) {
    if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

TensorFilter::TensorFilter(std::vector<std::string> include, std::vector<std::string> exclude)
    : include_(std::move(include)), exclude_(std::move(exclude)) {}

bool TensorFilter::Keeps(const std::string& name) const {
  if (empty()) return true;
  auto it = seen_.find(name);
  if (it != seen_.end()) return it->second;
  const bool keep = (include_.empty() || AnyMatches(include_, name)) && !AnyMatches(exclude_, name);
  seen_.emplace(name, keep);
  return keep;
}

}  // namespace wb::executor
