// Collects every validation problem of a plan request so that they are reported together,
// one per line, instead of stopping at the first.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace wb::planner {

class Problems {
 public:
  void Add(std::string line);
  // Appends `other`'s lines and count (lines past the cap are counted, not kept).
  void Merge(const Problems& other);
  bool empty() const { return count_ == 0; }
  size_t count() const { return count_; }
  // OK when empty; else InvalidArgument: "plan rejected: N problem(s):\n- ...\n- ...".
  absl::Status ToStatus() const;

 private:
  static constexpr size_t kMaxLines = 1000;  // the rest is summarized by count
  std::vector<std::string> lines_;
  size_t count_ = 0;
};

}  // namespace wb::planner
