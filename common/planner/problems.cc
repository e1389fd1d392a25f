#include "common/planner/problems.h"

#include "absl/strings/str_cat.h"

namespace wb::planner {

void Problems::Add(std::string line) {
  if (lines_.size() < kMaxLines) lines_.push_back(std::move(line));
  ++count_;
}

void Problems::Merge(const Problems& other) {
  for (const std::string& line : other.lines_) {
    if (lines_.size() < kMaxLines) lines_.push_back(line);
  }
  count_ += other.count_;
}

absl::Status Problems::ToStatus() const {
  if (count_ == 0) return absl::OkStatus();
  std::string msg =
      absl::StrCat("plan rejected: ", count_, count_ == 1 ? " problem:" : " problems:");
  for (const std::string& line : lines_) absl::StrAppend(&msg, "\n- ", line);
  if (count_ > lines_.size())
    absl::StrAppend(&msg, "\n- ... and ", count_ - lines_.size(), " more");
  return absl::InvalidArgumentError(msg);
}

}  // namespace wb::planner
