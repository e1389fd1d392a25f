#include "common/planner/tensor_name.h"

#include <deque>
#include <mutex>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>

namespace wb::planner {
namespace {

using tensor_name_internal::Interned;

// Lookups share the lock (the planner's threads look names up at once); interning a new name
// takes it alone.
struct Table {
  std::shared_mutex mu;
  std::deque<Interned> names;  // a deque never moves its elements: pointers stay valid
  std::unordered_map<std::string_view, const Interned*> index;  // views into `names`
};

Table& Names() {
  static Table* table = new Table;  // never destroyed: names outlive static destructors
  return *table;
}

std::string_view View(absl::string_view s) { return std::string_view(s.data(), s.size()); }

const Interned* Intern(absl::string_view name) {
  Table& t = Names();
  std::lock_guard<std::shared_mutex> lock(t.mu);
  auto it = t.index.find(View(name));
  if (it != t.index.end()) return it->second;
  const Interned* stored = &t.names.emplace_back(
      Interned{std::string(name.data(), name.size()), static_cast<uint32_t>(t.names.size())});
  t.index.emplace(std::string_view(stored->text), stored);
  return stored;
}

}  // namespace

TensorName::TensorName() {
  static const Interned* const empty = Intern("");
  s_ = empty;
}

TensorName::TensorName(absl::string_view s) : s_(Intern(s)) {}

std::optional<TensorName> TensorName::Find(absl::string_view name) {
  Table& t = Names();
  std::shared_lock<std::shared_mutex> lock(t.mu);
  auto it = t.index.find(View(name));
  if (it == t.index.end()) return std::nullopt;
  return TensorName(it->second);
}

uint32_t TensorName::Count() {
  Table& t = Names();
  std::shared_lock<std::shared_mutex> lock(t.mu);
  return static_cast<uint32_t>(t.names.size());
}

}  // namespace wb::planner
