#include "common/planner/tensor_name.h"

#include <deque>
#include <mutex>
#include <string_view>
#include <unordered_map>

namespace wb::planner {
namespace {

struct Table {
  std::mutex mu;
  std::deque<std::string> names;  // a deque never moves its elements: the ids stay valid
  std::unordered_map<std::string_view, const std::string*> index;  // views into `names`
};

Table& Names() {
  static Table* table = new Table;  // never destroyed: names outlive static destructors
  return *table;
}

const std::string* Intern(absl::string_view name) {
  const std::string_view s(name.data(), name.size());
  Table& t = Names();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.index.find(s);
  if (it != t.index.end()) return it->second;
  const std::string* stored = &t.names.emplace_back(s);
  t.index.emplace(std::string_view(*stored), stored);
  return stored;
}

}  // namespace

TensorName::TensorName() {
  static const std::string* const empty = Intern("");
  s_ = empty;
}

TensorName::TensorName(absl::string_view s) : s_(Intern(s)) {}

const std::string* TensorName::Find(absl::string_view name) {
  Table& t = Names();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.index.find(std::string_view(name.data(), name.size()));
  return it == t.index.end() ? nullptr : it->second;
}

}  // namespace wb::planner
