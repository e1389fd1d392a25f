// Planner step: per-side consistency and tiling checks; distinct source slices and holders.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parallel/parallel_for.h"
#include "common/planner/planner_internal.h"

namespace wb::planner {
namespace internal {

std::vector<uint32_t> Planner::BufferNameOrder(const std::vector<EntryRef>& parts) const {
  // Worked out once per distinct name: compared as strings inside the sort, the names took
  // most of the time of checking DeepSeek-V3's 1.5 M held parts.
  std::vector<TensorName> names;
  std::vector<uint32_t> order;  // by name id: the buffer name's position in string order
  for (const EntryRef& r : parts) {
    const TensorName b = E(r).view.buffer;
    if (b.id() >= order.size()) order.resize(b.id() + 1, UINT32_MAX);
    if (order[b.id()] != UINT32_MAX) continue;
    order[b.id()] = 0;
    names.push_back(b);
  }
  std::sort(names.begin(), names.end());
  for (size_t i = 0; i < names.size(); ++i) order[names[i].id()] = static_cast<uint32_t>(i);
  return order;
}

void Planner::SortByBuffer(std::vector<EntryRef>* parts, const std::vector<uint32_t>& order) const {
  struct Key {
    int32_t replica, rank;
    uint32_t buffer;
    EntryRef ref;
  };
  std::vector<Key> keys;
  keys.reserve(parts->size());
  for (const EntryRef& r : *parts) {
    const TensorEntry& e = E(r);
    keys.push_back({e.owner.replica, e.owner.rank, order[e.view.buffer.id()], r});
  }
  std::sort(keys.begin(), keys.end(), [&](const Key& x, const Key& y) {
    if (x.replica != y.replica) return x.replica < y.replica;
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.buffer != y.buffer) return x.buffer < y.buffer;
    return E(x.ref).view.offset < E(y.ref).view.offset;
  });
  for (size_t i = 0; i < keys.size(); ++i) (*parts)[i] = keys[i].ref;
}

void Planner::CheckBufferParts(Problems* out, const std::vector<EntryRef>& parts) const {
  auto same_buffer = [&](EntryRef x, EntryRef y) {
    const TensorEntry &a = E(x), &b = E(y);
    return x.agent == y.agent && a.owner.replica == b.owner.replica &&
           a.owner.rank == b.owner.rank && a.view.buffer == b.view.buffer;
  };
  // Buffer boxes: the part's box in buffer coordinates.
  auto buffer_box = [&](EntryRef r) {
    const TensorEntry& e = E(r);
    const Box held = EntryBox(e);
    Box b;
    b.ndim = static_cast<int>(e.view.shape.size());
    const int lead = b.ndim - held.ndim;
    for (int d = 0; d < b.ndim; ++d) {
      b.start[d] = e.view.offset[d];
      b.size[d] = d < lead ? 1 : held.size[d - lead];
    }
    return b;
  };
  size_t i = 0;
  while (i < parts.size()) {
    size_t j = i + 1;
    while (j < parts.size() && same_buffer(parts[i], parts[j])) ++j;
    const TensorEntry& first = E(parts[i]);
    bool reported = false;
    for (size_t p = i + 1; p < j && !reported; ++p) {
      const TensorEntry& e = E(parts[p]);
      if (e.dtype != first.dtype || e.view.shape != first.view.shape) {
        out->Add(absl::StrCat("buffer ", first.view.buffer.str(), " (", Who(parts[i]), "): part ",
                              first.name.str(), " sees it as ", DTypeName(first.dtype), " ",
                              FormatShape(first.view.shape), " but part ", e.name.str(), " as ",
                              DTypeName(e.dtype), " ", FormatShape(e.view.shape)));
        reported = true;
      }
    }
    // Sorted by offset: only parts starting before one's end along dim 0 can overlap it.
    for (size_t p = i; p < j && !reported; ++p) {
      const Box bp = buffer_box(parts[p]);
      for (size_t q = p + 1; q < j && !reported; ++q) {
        const Box bq = buffer_box(parts[q]);
        if (bq.start[0] >= bp.End(0)) break;
        Box tmp;
        if (Intersect(bp, bq, &tmp)) {
          out->Add(absl::StrCat("buffer ", first.view.buffer.str(), " (", Who(parts[i]),
                                "): parts overlap: ", E(parts[p]).name.str(), " at ", BoxString(bp),
                                " and ", E(parts[q]).name.str(), " at ", BoxString(bq)));
          reported = true;
        }
      }
    }
    i = j;
  }
}

void Planner::CheckBuffers() {
  // One agent's parts per task (a buffer is on one agent), problems joined in agent order: the
  // order of one sort by agent, replica, rank, buffer name and offset, whatever the threads.
  const std::vector<EntryRef> parts = std::move(view_entries_);
  const std::vector<uint32_t> order = BufferNameOrder(parts);
  std::vector<std::vector<EntryRef>> by_agent(agents_.size());
  for (const EntryRef& r : parts) by_agent[r.agent].push_back(r);
  std::vector<Problems> found(agents_.size());
  ParallelFor(by_agent.size(), Threads(), [&](uint64_t a) {
    if (by_agent[a].empty()) return;
    SortByBuffer(&by_agent[a], order);
    CheckBufferParts(&found[a], by_agent[a]);
  });
  for (const Problems& p : found) problems_.Merge(p);
}

bool Planner::CheckConsistent(Problems* out, int32_t name, const EntryRefs& refs) {
  const TensorEntry& first = E(refs[0]);
  for (const EntryRef& r : refs) {
    const TensorEntry& t = E(r);
    if (t.dtype != first.dtype || t.shape != first.shape) {
      out->Add(absl::StrCat("tensor ", Name(name),
                            " is registered inconsistently: ", DTypeName(first.dtype), " ",
                            FormatShape(first.shape), " on ", Who(refs[0]), " but ",
                            DTypeName(t.dtype), " ", FormatShape(t.shape), " on ", Who(r)));
      return false;
    }
  }
  return true;
}

bool Planner::CheckTiling(Problems* out, int32_t name, int32_t replica,
                          const std::vector<std::pair<Box, EntryRef>>& boxes) {
  auto side = [&] {
    return replica < 0 ? std::string("the trainers") : absl::StrCat("inference replica ", replica);
  };
  const auto& shape = E(boxes[0].second).shape;
  // The first partially overlapping pair is reported (one line per tensor, not per pair).
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t j = i + 1; j < boxes.size() && boxes[j].first.start[0] < boxes[i].first.End(0);
         ++j) {
      Box tmp;
      if (Intersect(boxes[i].first, boxes[j].first, &tmp)) {
        out->Add(absl::StrCat("shards of ", Name(name), " overlap among ", side(), ": ",
                              Who(boxes[i].second), " holds ", BoxString(boxes[i].first), " and ",
                              Who(boxes[j].second), " holds ", BoxString(boxes[j].first)));
        return false;
      }
    }
  }
  int64_t total = 1, covered = 0;
  for (int64_t s : shape) total *= s;
  bool dim0_only = true;
  for (const auto& [b, ref] : boxes) {
    covered += b.Volume();
    for (int d = 1; d < b.ndim; ++d) dim0_only &= (b.start[d] == 0 && b.size[d] == shape[d]);
  }
  if (covered == total) return true;
  std::string where;
  if (dim0_only) {
    int64_t next = 0;
    for (const auto& [b, ref] : boxes) {
      if (b.start[0] > next)
        absl::StrAppend(&where, where.empty() ? "" : ", ", "rows [", next, ", ", b.start[0], ")");
      next = b.End(0);
    }
    if (next < shape[0])
      absl::StrAppend(&where, where.empty() ? "" : ", ", "rows [", next, ", ", shape[0], ")");
  } else {
    where = absl::StrCat(total - covered, " of ", total, " elements");
  }
  out->Add(absl::StrCat("shards of ", Name(name), " ", FormatShape(shape), " among ", side(),
                        " leave holes: ", where, " held by no rank"));
  return false;
}

void Planner::SortedBoxes(const EntryRef* begin, const EntryRef* end,
                          std::vector<std::pair<Box, EntryRef>>* boxes) {
  boxes->clear();
  for (const EntryRef* r = begin; r != end; ++r) boxes->emplace_back(EntryBox(E(*r)), *r);
  auto less = [&](const std::pair<Box, EntryRef>& a, const std::pair<Box, EntryRef>& b) {
    if (!(a.first == b.first)) return a.first < b.first;
    return HolderLess(a.second, b.second);
  };
  // Entries usually arrive in order (ranks hold consecutive rows). Otherwise sort positions
  // and gather once: a (Box, EntryRef) pair is 150 bytes, too heavy to move around a sort.
  if (std::is_sorted(boxes->begin(), boxes->end(), less)) return;
  std::vector<uint32_t> order(boxes->size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return less((*boxes)[a], (*boxes)[b]); });
  std::vector<std::pair<Box, EntryRef>> sorted;
  sorted.reserve(boxes->size());
  for (uint32_t i : order) sorted.push_back((*boxes)[i]);
  boxes->swap(sorted);
}

bool Planner::HolderLess(EntryRef a, EntryRef b) const {
  if (agent_rank_[a.agent] != agent_rank_[b.agent]) {
    return agent_rank_[a.agent] < agent_rank_[b.agent];
  }
  const Owner &oa = E(a).owner, &ob = E(b).owner;
  if (oa.replica != ob.replica) return oa.replica < ob.replica;
  if (oa.rank != ob.rank) return oa.rank < ob.rank;
  return E(a).gpu < E(b).gpu;
}

bool Planner::DstLess(EntryRef a, EntryRef b) const {
  const int32_t ra = Replica(a), rb = Replica(b);
  if (ra != rb) return ra < rb;
  const int32_t ka = E(a).owner.rank, kb = E(b).owner.rank;
  if (ka != kb) return ka < kb;
  return HolderLess(a, b);
}

void Planner::CheckNames() {
  // Names in contiguous shards checked on their own threads (slices, holders and problems
  // per shard), then joined in name order: the same result as one pass over the names.
  const int threads = Threads();
  std::vector<uint64_t> work(infos_.size());
  for (size_t n = 0; n < infos_.size(); ++n)
    work[n] = infos_[n].src.size() + infos_[n].dst.size() + 1;
  std::vector<CheckShard> shards;
  // A name has at most one slice and exactly one holder per source entry: each shard's part
  // of the lists starts after the room the previous shards' names could need. Left
  // uninitialized: the shards' threads touch their own parts first.
  int64_t room = 0;
  for (const auto& [begin, end] : SplitByWork(work, threads)) {
    shards.emplace_back();
    shards.back().begin = begin;
    shards.back().end = end;
    shards.back().next_slice = static_cast<int32_t>(room);
    shards.back().next_holder = static_cast<int32_t>(room);
    for (size_t n = begin; n < end; ++n) room += static_cast<int64_t>(infos_[n].src.size());
  }
  slices_.reset(new Slice[room]);
  holders_.reset(new EntryRef[room]);
  ParallelFor(shards.size(), threads, [&](uint64_t i) {
    CheckShard* c = &shards[i];
    for (size_t n = c->begin; n < c->end; ++n) {
      if (!infos_[n].src.empty()) CheckSources(c, static_cast<int32_t>(n));
      if (!infos_[n].dst.empty()) CheckDestinations(c, static_cast<int32_t>(n));
    }
  });
  for (CheckShard& c : shards) problems_.Merge(c.problems);
}

void Planner::CheckSources(CheckShard* c, int32_t name) {
  NameInfo& info = infos_[name];
  if (!CheckConsistent(&c->problems, name, info.src)) {
    info.bad = true;
    return;
  }
  std::vector<std::pair<Box, EntryRef>>& boxes = c->boxes;
  std::vector<std::pair<Box, EntryRef>>& distinct = c->distinct;
  SortedBoxes(info.src.data(), info.src.data() + info.src.size(), &boxes);
  distinct.clear();
  info.slice_begin = c->next_slice;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (i == 0 || !(boxes[i].first == boxes[i - 1].first)) {
      distinct.push_back(boxes[i]);
      const Box& b = boxes[i].first;
      slices_[c->next_slice++] = Slice{b.start[0],
                                       b.size[0],
                                       b.ndim > 1 ? b.start[1] : 0,
                                       b.ndim > 1 ? b.size[1] : 0,
                                       b.ndim,
                                       c->next_holder,
                                       0};
      info.max_len0 = std::max(info.max_len0, boxes[i].first.size[0]);
    }
    holders_[c->next_holder++] = boxes[i].second;
    ++slices_[c->next_slice - 1].holder_count;
  }
  info.slice_count = c->next_slice - info.slice_begin;
  if (!CheckTiling(&c->problems, name, -1, distinct)) info.bad = true;
}

void Planner::CheckDestinations(CheckShard* c, int32_t name) {
  NameInfo& info = infos_[name];
  if (!CheckConsistent(&c->problems, name, info.dst)) {
    info.bad = true;
    return;
  }
  std::sort(info.dst.begin(), info.dst.end(),
            [&](EntryRef a, EntryRef b) { return DstLess(a, b); });
  size_t i = 0;
  while (i < info.dst.size()) {
    size_t j = i;
    int32_t replica = E(info.dst[i]).owner.replica;
    while (j < info.dst.size() && E(info.dst[j]).owner.replica == replica) ++j;
    std::vector<std::pair<Box, EntryRef>>& boxes = c->boxes;
    std::vector<std::pair<Box, EntryRef>>& distinct = c->distinct;
    SortedBoxes(info.dst.data() + i, info.dst.data() + j, &boxes);
    distinct.clear();
    for (size_t k = 0; k < boxes.size(); ++k) {
      if (k == 0 || !(boxes[k].first == boxes[k - 1].first)) distinct.push_back(boxes[k]);
    }
    if (!CheckTiling(&c->problems, name, replica, distinct)) info.bad = true;
    i = j;
  }
}

}  // namespace internal

}  // namespace wb::planner
