#include "common/planner/tensor_name.h"

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <string_view>
#include <unordered_map>

namespace wb::planner {
namespace {

using tensor_name_internal::Interned;

// The table is split into shards by the name's hash, each with its own lock, so that threads
// interning or looking up names at once (the controller converting layouts on every core, the
// planner's threads resolving names) seldom meet on one lock. Ids come from one counter.
constexpr size_t kShards = 64;

struct Shard {
  std::mutex mu;
  std::deque<Interned> names;  // a deque never moves its elements: pointers stay valid
  std::unordered_map<std::string_view, const Interned*> index;  // views into `names`
};

struct Table {
  std::array<Shard, kShards> shards;
  std::atomic<uint32_t> next_id{0};
};

Table& Names() {
  static Table* table = new Table;  // never destroyed: names outlive static destructors
  return *table;
}

Shard& ShardOf(Table& t, std::string_view name) {
  return t.shards[std::hash<std::string_view>()(name) % kShards];
}

std::string_view View(absl::string_view s) { return std::string_view(s.data(), s.size()); }

const Interned* Intern(absl::string_view name) {
  Table& t = Names();
  Shard& shard = ShardOf(t, View(name));
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.index.find(View(name));
  if (it != shard.index.end()) return it->second;
  const Interned* stored = &shard.names.emplace_back(
      Interned{std::string(name.data(), name.size()), t.next_id.fetch_add(1)});
  shard.index.emplace(std::string_view(stored->text), stored);
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
  Shard& shard = ShardOf(t, View(name));
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.index.find(View(name));
  if (it == shard.index.end()) return std::nullopt;
  return TensorName(it->second);
}

uint32_t TensorName::Count() { return Names().next_id.load(); }

}  // namespace wb::planner
