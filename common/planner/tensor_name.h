// Tensor and buffer names, interned for the whole process: each distinct string is stored once
// and a TensorName is a pointer to it, so that 14 M layout entries of a Kimi-K2 plan hold 8
// bytes each instead of a string, and equal names compare (and hash) as pointers. The table
// only grows: it holds every distinct name the process has seen (tens of thousands per model).
#pragma once

#include <cstddef>
#include <functional>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"

namespace wb::planner {

class TensorName {
 public:
  TensorName();  // ""
  // Implicit, so that call sites assigning strings compile unchanged. Interns `s`.
  TensorName(absl::string_view s);                                        // NOLINT
  TensorName(const std::string& s) : TensorName(absl::string_view(s)) {}  // NOLINT
  TensorName(const char* s) : TensorName(absl::string_view(s)) {}         // NOLINT

  // The interned name of `s` when some TensorName holds it; nullptr otherwise (no insertion).
  static const std::string* Find(absl::string_view s);

  const std::string& str() const { return *s_; }
  operator const std::string&() const { return *s_; }  // NOLINT
  absl::string_view view() const { return *s_; }
  const char* c_str() const { return s_->c_str(); }
  bool empty() const { return s_->empty(); }
  size_t size() const { return s_->size(); }
  // Equal names have equal ids for the life of the process.
  const std::string* id() const { return s_; }

  friend bool operator==(TensorName a, TensorName b) { return a.s_ == b.s_; }
  friend bool operator!=(TensorName a, TensorName b) { return a.s_ != b.s_; }
  // By text (not by id), so sorted output does not depend on the order names were interned.
  friend bool operator<(TensorName a, TensorName b) { return *a.s_ < *b.s_; }
  friend std::ostream& operator<<(std::ostream& os, TensorName n) { return os << *n.s_; }

 private:
  const std::string* s_;
};

}  // namespace wb::planner

template <>
struct std::hash<wb::planner::TensorName> {
  size_t operator()(wb::planner::TensorName n) const {
    return std::hash<const std::string*>()(n.id());
  }
};
