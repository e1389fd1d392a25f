// Tensor and buffer names, interned for the whole process: each distinct string is stored once
// and a TensorName is a pointer to it, so that 14 M layout entries of a Kimi-K2 plan hold 8
// bytes each instead of a string, and equal names compare as pointers. Each distinct name also
// has a dense id (0, 1, 2, ... in interning order), so the planner indexes names in a vector
// instead of a hash map. The table only grows: it holds every distinct name the process has
// seen (tens of thousands per model).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"

namespace wb::planner {

namespace tensor_name_internal {
struct Interned {
  std::string text;
  uint32_t id;
};
}  // namespace tensor_name_internal

class TensorName {
 public:
  TensorName();  // ""
  // Implicit, so that call sites assigning strings compile unchanged. Interns `s`.
  TensorName(absl::string_view s);                                        // NOLINT
  TensorName(const std::string& s) : TensorName(absl::string_view(s)) {}  // NOLINT
  TensorName(const char* s) : TensorName(absl::string_view(s)) {}         // NOLINT

  // The interned name `s` when it has been interned; nullopt otherwise (no insertion).
  static std::optional<TensorName> Find(absl::string_view s);
  // How many distinct names have been interned: every id is below it.
  static uint32_t Count();

  const std::string& str() const { return s_->text; }
  operator const std::string&() const { return s_->text; }  // NOLINT
  absl::string_view view() const { return s_->text; }
  const char* c_str() const { return s_->text.c_str(); }
  bool empty() const { return s_->text.empty(); }
  size_t size() const { return s_->text.size(); }
  // Equal names have equal ids for the life of the process; ids are dense from 0.
  uint32_t id() const { return s_->id; }

  friend bool operator==(TensorName a, TensorName b) { return a.s_ == b.s_; }
  friend bool operator!=(TensorName a, TensorName b) { return a.s_ != b.s_; }
  // By text (not by id), so sorted output does not depend on the order names were interned.
  friend bool operator<(TensorName a, TensorName b) { return a.s_->text < b.s_->text; }
  friend std::ostream& operator<<(std::ostream& os, TensorName n) { return os << n.s_->text; }

 private:
  explicit TensorName(const tensor_name_internal::Interned* s) : s_(s) {}
  const tensor_name_internal::Interned* s_;
};

}  // namespace wb::planner

template <>
struct std::hash<wb::planner::TensorName> {
  size_t operator()(wb::planner::TensorName n) const { return std::hash<uint32_t>()(n.id()); }
};
