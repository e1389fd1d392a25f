// Planner step before generation: FP8 checks of every destination entry, and destination
// classes. Entries of one name with the same geometry (box, place in their buffer, scale place)
// receive exactly the same ops up to the destination, so they are planned once and the op fans
// out to all of them: typically the same rank of every inference replica. Classes that differ
// only in their columns (tensor-parallel siblings of a row-parallel weight) share the op too
// when every source slice holds whole rows: a sibling reads the same rows at other columns.
// This keeps the plan (and the time to build it) proportional to source slices x distinct
// row ranges instead of x receivers.
#include <algorithm>
#include <cstring>

#include "common/planner/planner_internal.h"

namespace wb::planner {
namespace internal {
namespace {

// Everything the ops of a destination entry depend on, besides the entry itself.
struct Geometry {
  Box box;
  Placement place;
  Placement scale;    // FP8 only, else default
  bool view = false;  // FP8 source-cut checks differ for views
};

bool SamePlacement(const Placement& a, const Placement& b, int ndim) {
  if (!(a.held == b.held) || a.base != b.base) return false;
  for (int d = 0; d < ndim; ++d) {
    if (a.stride[d] != b.stride[d] || a.extent[d] != b.extent[d]) return false;
  }
  return true;
}

bool SameGeometry(const Geometry& a, const Geometry& b) {
  return a.view == b.view && a.box == b.box && SamePlacement(a.place, b.place, a.box.ndim) &&
         SamePlacement(a.scale, b.scale, a.scale.held.ndim);
}

uint64_t HashPlacement(uint64_t h, const Placement& p, int ndim) {
  h = Mix(h, static_cast<uint64_t>(p.base));
  for (int d = 0; d < ndim; ++d) {
    h = Mix(h, static_cast<uint64_t>(p.held.start[d]));
    h = Mix(h, static_cast<uint64_t>(p.held.size[d]));
    h = Mix(h, static_cast<uint64_t>(p.stride[d]));
    h = Mix(h, static_cast<uint64_t>(p.extent[d]));
  }
  return h;
}

uint64_t HashGeometry(const Geometry& g) {
  uint64_t h = Mix(g.view, static_cast<uint64_t>(g.box.ndim));
  for (int d = 0; d < g.box.ndim; ++d) {
    h = Mix(Mix(h, static_cast<uint64_t>(g.box.start[d])), static_cast<uint64_t>(g.box.size[d]));
  }
  h = HashPlacement(h, g.place, g.box.ndim);
  return HashPlacement(h, g.scale, g.scale.held.ndim);
}

}  // namespace

int64_t Planner::SiblingElemBytes(int32_t n) const {
  const NameInfo& info = infos_[n];
  if (E(info.dst[0]).shape.size() != 2) return 0;
  // Fused along columns, a sibling's columns would come from other parts.
  if (info.fusion_dim != 0 && (info.parts.size() != 1 || info.parts[0].offset != 0)) return 0;
  for (const Part& part : info.parts) {
    const NameInfo& src = infos_[part.src_name];
    if (src.src.empty()) return 0;
    const int64_t cols = E(src.src[0]).shape.size() == 2 ? E(src.src[0]).shape[1] : -1;
    for (int32_t k = src.slice_begin; k < src.slice_begin + src.slice_count; ++k) {
      const Slice& slice = slices_[k];
      // One holder: a choice between replicas is made per op, and siblings share theirs.
      if (slice.ndim != 2 || slice.start1 != 0 || slice.size1 != cols || slice.holder_count != 1) {
        return 0;
      }
    }
  }
  return static_cast<int64_t>(DTypeBytes(E(infos_[info.parts[0].src_name].src[0]).dtype));
}

void Planner::GroupDestinations(GenShard* g) {
  Problems* out = &g->problems;
  std::vector<Geometry> geo;
  std::vector<int32_t> scale;
  std::vector<std::pair<uint64_t, uint32_t>> order;  // (geometry hash, position in info.dst)
  std::vector<int32_t> class_of;
  std::vector<std::vector<uint32_t>> members;
  std::vector<Destination> group, groups;  // groups: every class's, in class order
  std::vector<uint32_t> leaders, group_begin;
  std::vector<char> alone;  // per class: its mirrors' entries each follow their template's
  std::vector<int32_t> sibling_of;
  std::vector<int64_t> shifted;  // per class: its leader's first column
  for (size_t position = g->begin; position < g->end; ++position) {
    const int32_t n = dst_names_[position];
    NameInfo& info = infos_[n];
    info.classes.clear();
    if (info.bad || info.derived_scale || info.parts.empty()) continue;
    const bool fp8 = info.transform == weightbeam::v1::TRANSFORM_FP8_BLOCK;
    const size_t count = info.dst.size();
    // Reused, not cleared: a Geometry is ~700 bytes, and only its first ndim dims are read.
    if (geo.size() < count) geo.resize(count);
    scale.assign(count, -1);
    for (size_t i = 0; i < count; ++i) {
      const EntryRef dref = info.dst[i];
      geo[i].scale.held.ndim = 0;
      geo[i].scale.base = 0;
      geo[i].box = EntryBox(E(dref));
      geo[i].place = EntryPlacement(E(dref));
      geo[i].view = !E(dref).view.empty();
      if (fp8) {
        // A failing entry reports the name's problem; the name then gets no ops.
        if (!CheckFp8Entry(out, n, dref, geo[i].box, &scale[i], i)) break;
        geo[i].scale = EntryPlacement(E(dref.agent, scale[i]));
      }
    }
    if (info.fp8_error_reported) continue;
    if (!options_.fan_out) {  // BuildPlan unfolds mirrors in this mode
      for (size_t i = 0; i < count; ++i)
        info.classes.push_back(DstClass{info.dst[i], scale[i], -1});
      continue;
    }
    // Sort by geometry hash; equal hashes are compared in full (collisions split a run).
    order.resize(count);
    for (size_t i = 0; i < count; ++i) order[i] = {HashGeometry(geo[i]), static_cast<uint32_t>(i)};
    std::sort(order.begin(), order.end());
    class_of.assign(count, -1);
    members.clear();
    for (size_t lo = 0; lo < count;) {
      size_t hi = lo;
      while (hi < count && order[hi].first == order[lo].first) ++hi;
      for (size_t a = lo; a < hi; ++a) {
        const uint32_t i = order[a].second;
        if (class_of[i] >= 0) continue;
        class_of[i] = static_cast<int32_t>(members.size());
        members.push_back({i});
        for (size_t b = a + 1; b < hi; ++b) {
          const uint32_t j = order[b].second;
          if (class_of[j] < 0 && SameGeometry(geo[i], geo[j])) {
            class_of[j] = class_of[i];
            members.back().push_back(j);
          }
        }
      }
      lo = hi;
    }
    // Classes in the order of their first member (info.dst is canonical); members were added
    // in increasing position, so the leader is the front. A member's mirrors (the same entry
    // on agents repeating its agent for other replicas) join its class: their geometry is its.
    bool mirrored = false;
    leaders.clear();
    alone.clear();
    group_begin.assign(1, 0);
    groups.clear();
    for (size_t i = 0; i < count; ++i) {
      std::vector<uint32_t>& m = members[class_of[i]];
      if (m.empty() || m.front() != i) continue;  // not the leader, or already emitted
      const size_t begin = groups.size();
      bool has_mirrors = false;
      for (uint32_t k : m) {
        const EntryRef r = info.dst[k];
        groups.push_back(Destination{r.agent, r.tensor, scale[k]});
        for (int32_t mirror : mirrors_[r.agent]) {
          groups.push_back(Destination{mirror, r.tensor, scale[k]});
          has_mirrors = true;
        }
      }
      auto less = [&](const Destination& a, const Destination& b) {
        return DstLess(EntryRef{a.agent, a.tensor}, EntryRef{b.agent, b.tensor});
      };
      // In canonical order each entry is followed by its mirrors (the usual case): the group
      // can list the entry alone (Plan::fanout_mirrored).
      bool listed_alone = has_mirrors;
      if (has_mirrors && !std::is_sorted(groups.begin() + begin, groups.end(), less)) {
        std::stable_sort(groups.begin() + begin, groups.end(), less);
        listed_alone = false;
      }
      mirrored |= has_mirrors;
      alone.push_back(listed_alone);
      leaders.push_back(i);
      group_begin.push_back(static_cast<uint32_t>(groups.size()));
      m.clear();
    }
    // Tensor-parallel siblings (the same rows, other columns) share one op when every source
    // slice holds whole rows: their ops differ only by where they start in the source.
    const int64_t elem = leaders.size() > 1 ? SiblingElemBytes(n) : 0;
    sibling_of.assign(leaders.size(), -1);
    shifted.assign(leaders.size(), 0);
    if (elem > 0) {
      for (size_t c = 0; c < leaders.size(); ++c) {
        Geometry& key = geo[leaders[c]];
        shifted[c] = key.box.start[1];
        key.box.start[1] = key.place.held.start[1] = key.scale.held.start[1] = 0;
      }
      for (size_t c = 0; c < leaders.size(); ++c) {
        if (sibling_of[c] >= 0) continue;
        for (size_t d = c + 1; d < leaders.size(); ++d) {
          const int64_t shift = (shifted[d] - shifted[c]) * elem;
          if (sibling_of[d] < 0 && shift >= INT32_MIN && shift <= INT32_MAX &&
              SameGeometry(geo[leaders[c]], geo[leaders[d]])) {
            sibling_of[d] = static_cast<int32_t>(c);
          }
        }
      }
    }
    for (size_t c = 0; c < leaders.size(); ++c) {
      if (sibling_of[c] >= 0) continue;  // joined the op of an earlier sibling
      // The op's classes: c and its siblings, each with its column shift.
      bool all_alone = alone[c];
      for (size_t d = c + 1; d < leaders.size(); ++d) {
        if (sibling_of[d] == static_cast<int32_t>(c)) all_alone = all_alone && alone[d];
      }
      group.clear();
      uint32_t executed = 0;
      for (size_t d = c; d < leaders.size(); ++d) {
        if (d != c && sibling_of[d] != static_cast<int32_t>(c)) continue;
        const int32_t shift = static_cast<int32_t>((shifted[d] - shifted[c]) * elem);
        executed += group_begin[d + 1] - group_begin[d];
        for (uint32_t k = group_begin[d]; k < group_begin[d + 1]; ++k) {
          if (all_alone && IsMirror(groups[k].agent)) continue;  // executed after its entry
          group.push_back(groups[k]);
          group.back().src_shift = shift;
        }
      }
      int32_t fanout = -1;
      if (executed > 1) {  // numbered within the shard; Generate renumbers
        fanout = static_cast<int32_t>(g->fanout_sizes.size());
        g->fanout_dsts.insert(g->fanout_dsts.end(), group.begin(), group.end());
        g->fanout_sizes.push_back(static_cast<uint32_t>(group.size()));
        g->fanout_mirrored.push_back(all_alone ? 1 : 0);
        g->fanout_executed.push_back(executed);
      }
      info.classes.push_back(
          DstClass{EntryRef{group[0].agent, group[0].tensor}, group[0].scale_tensor, fanout});
    }
    // With mirrors a class's first member may be a mirror's entry: keep the classes in the
    // order of their first members, as for the unfolded layouts.
    if (mirrored) {
      std::stable_sort(
          info.classes.begin(), info.classes.end(),
          [&](const DstClass& a, const DstClass& b) { return DstLess(a.leader, b.leader); });
    }
  }
}

}  // namespace internal
}  // namespace wb::planner
