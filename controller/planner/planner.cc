// BuildPlan: index -> validate -> match names -> intersect shards -> choose sources ->
// assign rails -> order into phases -> statistics and hash. See plan.h and README.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <regex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/planner/plan.h"
#include "controller/planner/problems.h"
#include "controller/planner/reshard.h"

namespace wb::planner {

uint64_t PlannedOp::DstBytes() const {
  uint64_t bytes = rows * row_elems * static_cast<uint64_t>(DTypeBytes(DstDType()));
  if (transform == weightbeam::v1::TRANSFORM_FP8_BLOCK) {
    bytes += ((rows + kFp8Block - 1) / kFp8Block) * ((row_elems + kFp8Block - 1) / kFp8Block) * 4;
  }
  return bytes;
}

namespace {

struct EntryRef {
  int32_t agent;
  int32_t tensor;
};

// A distinct slice of a source tensor and the entries (replicas) holding exactly it.
struct Slice {
  int64_t start0;
  int64_t size0;
  int64_t start1;  // dimension 1 when ndim == 2, so 1-D and 2-D slices need no entry lookup
  int64_t size1;
  int32_t ndim;
  int32_t holder_begin;
  int32_t holder_count;
};

struct Part {
  int32_t src_name;
  int64_t offset;  // along the fusion dimension, in the destination
};

struct NameInfo {
  std::vector<EntryRef> src;
  std::vector<EntryRef> dst;
  bool bad = false;
  // Sources: distinct slices sorted by start along dim 0.
  int32_t slice_begin = 0;
  int32_t slice_count = 0;
  int64_t max_len0 = 0;
  // Destinations.
  bool derived_scale = false;  // an FP8 scale tensor written by its weight's ops
  bool fp8_error_reported = false;
  int32_t fusion_dim = 0;
  std::vector<Part> parts;
  Transform transform = weightbeam::v1::TRANSFORM_UNSPECIFIED;
  int32_t scale_name = -1;
  int32_t phase = 0;
};

// An op whose source range several holders (replicas) have; chosen when balancing.
struct PendingChoice {
  PlannedOp op;
  int32_t slice;
};

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

constexpr uint64_t kPrime = 0x100000001b3ULL * 0x9e3779b1ULL + 2;  // odd multiplier

uint64_t HashString(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

bool IsFloat(DType d) {
  return d == weightbeam::v1::DTYPE_F32 || d == weightbeam::v1::DTYPE_F16 ||
         d == weightbeam::v1::DTYPE_BF16;
}

int32_t LayerPhase(std::string_view name, int layers_per_phase) {
  size_t pos = name.find("layers.");
  if (pos == std::string_view::npos || layers_per_phase <= 0) return 0;
  pos += 7;
  int64_t layer = 0;
  bool digits = false;
  while (pos < name.size() && name[pos] >= '0' && name[pos] <= '9') {
    layer = layer * 10 + (name[pos++] - '0');
    digits = true;
  }
  return digits ? static_cast<int32_t>(layer / layers_per_phase) : 0;
}

bool Aligned(int64_t boundary, int64_t extent) {
  return boundary % kFp8Block == 0 || boundary == extent;
}

std::string BoxString(const Box& b) {
  std::string out = "[";
  for (int d = 0; d < b.ndim; ++d) absl::StrAppend(&out, d ? ", " : "", b.start[d], ":", b.End(d));
  return out + "]";
}

// The first block boundary `box` cuts along dimension d, or -1.
int64_t SplitBoundary(const Box& box, int d, int64_t extent) {
  if (!Aligned(box.start[d], extent)) return box.start[d];
  if (!Aligned(box.End(d), extent)) return box.End(d);
  return -1;
}

class Planner {
 public:
  Planner(const std::vector<AgentLayout>& agents, const PlanOptions& options)
      : agents_(agents), options_(options) {}

  absl::StatusOr<Plan> Build() {
    OrderAgents();
    IndexEntries();
    for (size_t n = 0; n < infos_.size(); ++n) {
      if (!infos_[n].src.empty()) CheckSources(static_cast<int32_t>(n));
      if (!infos_[n].dst.empty()) CheckDestinations(static_cast<int32_t>(n));
    }
    ApplyRenames();
    ResolveRecipes();
    Generate();
    if (!problems_.empty()) return problems_.ToStatus();
    BuildDevices();
    ChooseSources();
    OrderOps();
    Finish();
    return std::move(plan_);
  }

 private:
  const TensorEntry& E(EntryRef r) const { return agents_[r.agent].tensors[r.tensor]; }
  std::string Who(EntryRef r) const { return FormatOwner(E(r).owner, agents_[r.agent].name); }
  absl::string_view Name(int32_t id) const {
    return absl::string_view(names_[id].data(), names_[id].size());
  }

  void OrderAgents() {
    plan_.agent_order.resize(agents_.size());
    std::iota(plan_.agent_order.begin(), plan_.agent_order.end(), 0);
    std::sort(plan_.agent_order.begin(), plan_.agent_order.end(),
              [&](int32_t a, int32_t b) { return agents_[a].name < agents_[b].name; });
    agent_rank_.resize(agents_.size());
    for (size_t i = 0; i < plan_.agent_order.size(); ++i) {
      agent_rank_[plan_.agent_order[i]] = static_cast<int32_t>(i);
      if (i > 0 && agents_[plan_.agent_order[i]].name == agents_[plan_.agent_order[i - 1]].name) {
        problems_.Add(absl::StrCat("agent name ", agents_[plan_.agent_order[i]].name,
                                   " appears more than once"));
      }
    }
  }

  // Per-entry checks, then the name index (sources = trainer role, destinations = inference).
  void IndexEntries() {
    size_t total = 0;
    for (const AgentLayout& a : agents_) total += a.tensors.size();
    name_ids_.reserve(total / 2 + 16);
    tensor_name_.resize(agents_.size());
    for (size_t ai = 0; ai < agents_.size(); ++ai) {
      const AgentLayout& agent = agents_[ai];
      tensor_name_[ai].assign(agent.tensors.size(), -1);
      for (size_t ti = 0; ti < agent.tensors.size(); ++ti) {
        const TensorEntry& t = agent.tensors[ti];
        EntryRef ref{static_cast<int32_t>(ai), static_cast<int32_t>(ti)};
        if (!CheckEntry(ref)) continue;
        auto [it, inserted] = name_ids_.try_emplace(t.name, static_cast<int32_t>(names_.size()));
        if (inserted) {
          names_.push_back(t.name);
          infos_.emplace_back();
        }
        tensor_name_[ai][ti] = it->second;
        if (EntryBox(t).Volume() == 0) continue;  // holds nothing
        NameInfo& info = infos_[it->second];
        (t.owner.role == Role::kTrainer ? info.src : info.dst).push_back(ref);
      }
    }
  }

  bool CheckEntry(EntryRef ref) {
    const TensorEntry& t = E(ref);
    auto fail = [&](const std::string& why) {
      problems_.Add(absl::StrCat("tensor ", t.name, " (", Who(ref), "): ", why));
      return false;
    };
    if (t.name.empty()) return fail("empty name");
    if (DTypeBytes(t.dtype) == 0) return fail("unknown dtype");
    if (t.shape.empty() || t.shape.size() > kMaxDims) {
      return fail(absl::StrCat("shape ", FormatShape(t.shape), " must have 1 to ", kMaxDims,
                               " dimensions"));
    }
    for (int64_t s : t.shape) {
      if (s <= 0)
        return fail(absl::StrCat("shape ", FormatShape(t.shape), " has an empty dimension"));
    }
    if (!t.shard.empty()) {
      if (t.shard.size() != t.shape.size()) {
        return fail(absl::StrCat("shard has ", t.shard.size(), " dimensions but shape ",
                                 FormatShape(t.shape), " has ", t.shape.size()));
      }
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (t.shard[d].start < 0 || t.shard[d].size < 0 ||
            t.shard[d].start + t.shard[d].size > t.shape[d]) {
          return fail(absl::StrCat("shard ", FormatSlice(t.shard, t.shape),
                                   " lies outside the global shape ", FormatShape(t.shape)));
        }
      }
    }
    uint64_t need = static_cast<uint64_t>(EntryBox(t).Volume() * DTypeBytes(t.dtype));
    if (t.region_bytes < need) {
      return fail(absl::StrCat("region ", t.region, " has ", t.region_bytes,
                               " bytes but the shard needs ", need));
    }
    return true;
  }

  // Every entry of a name on one side agrees on dtype and global shape.
  bool CheckConsistent(int32_t name, const std::vector<EntryRef>& refs) {
    const TensorEntry& first = E(refs[0]);
    for (const EntryRef& r : refs) {
      const TensorEntry& t = E(r);
      if (t.dtype != first.dtype || t.shape != first.shape) {
        problems_.Add(absl::StrCat("tensor ", Name(name),
                                   " is registered inconsistently: ", DTypeName(first.dtype), " ",
                                   FormatShape(first.shape), " on ", Who(refs[0]), " but ",
                                   DTypeName(t.dtype), " ", FormatShape(t.shape), " on ", Who(r)));
        return false;
      }
    }
    return true;
  }

  // `boxes` sorted and distinct: report partial overlaps and holes. `side` says whose shards.
  bool CheckTiling(int32_t name, const std::string& side,
                   const std::vector<std::pair<Box, EntryRef>>& boxes) {
    const std::vector<int64_t>& shape = E(boxes[0].second).shape;
    bool ok = true;
    int reported = 0;
    for (size_t i = 0; i < boxes.size() && reported < 3; ++i) {
      for (size_t j = i + 1; j < boxes.size() && boxes[j].first.start[0] < boxes[i].first.End(0);
           ++j) {
        Box tmp;
        if (Intersect(boxes[i].first, boxes[j].first, &tmp)) {
          problems_.Add(absl::StrCat("shards of ", Name(name), " overlap among ", side, ": ",
                                     Who(boxes[i].second), " holds ", BoxString(boxes[i].first),
                                     " and ", Who(boxes[j].second), " holds ",
                                     BoxString(boxes[j].first)));
          ok = false;
          if (++reported >= 3) break;
        }
      }
    }
    if (!ok) return false;
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
    problems_.Add(absl::StrCat("shards of ", Name(name), " ", FormatShape(shape), " among ", side,
                               " leave holes: ", where, " held by no rank"));
    return false;
  }

  std::vector<std::pair<Box, EntryRef>> SortedBoxes(const std::vector<EntryRef>& refs) {
    std::vector<std::pair<Box, EntryRef>> boxes;
    boxes.reserve(refs.size());
    for (const EntryRef& r : refs) boxes.emplace_back(EntryBox(E(r)), r);
    std::sort(boxes.begin(), boxes.end(), [&](const auto& a, const auto& b) {
      if (!(a.first == b.first)) return a.first < b.first;
      return HolderLess(a.second, b.second);
    });
    return boxes;
  }

  bool HolderLess(EntryRef a, EntryRef b) const {
    if (agent_rank_[a.agent] != agent_rank_[b.agent]) {
      return agent_rank_[a.agent] < agent_rank_[b.agent];
    }
    const Owner &oa = E(a).owner, &ob = E(b).owner;
    if (oa.replica != ob.replica) return oa.replica < ob.replica;
    if (oa.rank != ob.rank) return oa.rank < ob.rank;
    return E(a).gpu < E(b).gpu;
  }

  // Sources: identical slices are alternatives (replicas); distinct slices must tile exactly.
  void CheckSources(int32_t name) {
    NameInfo& info = infos_[name];
    if (!CheckConsistent(name, info.src)) {
      info.bad = true;
      return;
    }
    auto boxes = SortedBoxes(info.src);
    std::vector<std::pair<Box, EntryRef>> distinct;
    info.slice_begin = static_cast<int32_t>(slices_.size());
    for (size_t i = 0; i < boxes.size(); ++i) {
      if (i == 0 || !(boxes[i].first == boxes[i - 1].first)) {
        distinct.push_back(boxes[i]);
        const Box& b = boxes[i].first;
        slices_.push_back(Slice{b.start[0], b.size[0], b.ndim > 1 ? b.start[1] : 0,
                                b.ndim > 1 ? b.size[1] : 0, b.ndim,
                                static_cast<int32_t>(holders_.size()), 0});
        info.max_len0 = std::max(info.max_len0, boxes[i].first.size[0]);
      }
      holders_.push_back(boxes[i].second);
      ++slices_.back().holder_count;
    }
    info.slice_count = static_cast<int32_t>(slices_.size()) - info.slice_begin;
    if (!CheckTiling(name, "the trainers", distinct)) info.bad = true;
  }

  // Destinations: within each inference replica, distinct slices tile exactly (identical
  // slices on several ranks are replicated copies, each written).
  void CheckDestinations(int32_t name) {
    NameInfo& info = infos_[name];
    if (!CheckConsistent(name, info.dst)) {
      info.bad = true;
      return;
    }
    std::sort(info.dst.begin(), info.dst.end(), [&](EntryRef a, EntryRef b) {
      const Owner &oa = E(a).owner, &ob = E(b).owner;
      if (oa.replica != ob.replica) return oa.replica < ob.replica;
      if (oa.rank != ob.rank) return oa.rank < ob.rank;
      return HolderLess(a, b);
    });
    size_t i = 0;
    while (i < info.dst.size()) {
      size_t j = i;
      int32_t replica = E(info.dst[i]).owner.replica;
      while (j < info.dst.size() && E(info.dst[j]).owner.replica == replica) ++j;
      std::vector<EntryRef> group(info.dst.begin() + i, info.dst.begin() + j);
      auto boxes = SortedBoxes(group);
      std::vector<std::pair<Box, EntryRef>> distinct;
      for (size_t k = 0; k < boxes.size(); ++k) {
        if (k == 0 || !(boxes[k].first == boxes[k - 1].first)) distinct.push_back(boxes[k]);
      }
      if (!CheckTiling(name, absl::StrCat("inference replica ", replica), distinct))
        info.bad = true;
      i = j;
    }
  }

  // canonical (destination-space) name -> source name id.
  void ApplyRenames() {
    if (options_.renames.empty()) return;
    std::vector<std::pair<std::regex, std::string>> rules;
    for (const config::RenameRule& r : options_.renames) {
      try {
        std::string fmt = std::regex_replace(r.replacement, std::regex(R"(\\(\d))"), "$$$1");
        rules.emplace_back(std::regex(r.pattern), fmt);
      } catch (const std::regex_error& e) {
        problems_.Add(absl::StrCat("rename rule ", r.pattern, ": invalid regular expression"));
      }
    }
    for (size_t n = 0; n < infos_.size(); ++n) {
      if (infos_[n].src.empty()) continue;
      std::string canonical(Name(static_cast<int32_t>(n)));
      for (const auto& [re, fmt] : rules) {
        if (std::regex_match(canonical, re)) {
          canonical = std::regex_replace(canonical, re, fmt);
          break;
        }
      }
      auto [it, inserted] = canonical_.try_emplace(canonical, static_cast<int32_t>(n));
      if (!inserted) {
        problems_.Add(absl::StrCat("sources ", Name(it->second), " and ", Name(n),
                                   " both map to destination name ", canonical));
      }
    }
  }

  int32_t FindSource(const std::string& dst_name) const {
    if (!options_.renames.empty()) {
      auto it = canonical_.find(dst_name);
      return it == canonical_.end() ? -1 : it->second;
    }
    auto it = name_ids_.find(dst_name);
    if (it == name_ids_.end() || infos_[it->second].src.empty()) return -1;
    return it->second;
  }

  std::string SrcWho(int32_t src_name) const {
    return absl::StrCat(Name(src_name), " ", FormatShape(E(infos_[src_name].src[0]).shape), " ",
                        DTypeName(E(infos_[src_name].src[0]).dtype), " on ",
                        Who(infos_[src_name].src[0]));
  }

  void ResolveRecipes() {
    // Destination names in canonical (sorted) order: generation follows it.
    for (size_t n = 0; n < infos_.size(); ++n) {
      if (!infos_[n].dst.empty()) dst_names_.push_back(static_cast<int32_t>(n));
    }
    std::sort(dst_names_.begin(), dst_names_.end(),
              [&](int32_t a, int32_t b) { return Name(a) < Name(b); });
    for (int32_t n : dst_names_) Resolve(n);
    // Scale tensors of FP8-block destinations are written by the weight's ops.
    for (int32_t n : dst_names_) {
      NameInfo& info = infos_[n];
      if (info.transform != weightbeam::v1::TRANSFORM_FP8_BLOCK) continue;
      std::string scale = absl::StrCat(Name(n), "_scale_inv");
      auto it = name_ids_.find(scale);
      const TensorEntry& w = E(info.dst[0]);
      if (it == name_ids_.end() || infos_[it->second].dst.empty()) {
        problems_.Add(absl::StrCat("FP8 destination ", Name(n), " (", Who(info.dst[0]),
                                   ") has no scale tensor ", scale));
        info.bad = true;
        continue;
      }
      NameInfo& s = infos_[it->second];
      s.derived_scale = true;
      info.scale_name = it->second;
      const TensorEntry& st = E(s.dst[0]);
      std::vector<int64_t> want = {(w.shape[0] + kFp8Block - 1) / kFp8Block,
                                   (w.shape[1] + kFp8Block - 1) / kFp8Block};
      if (st.dtype != weightbeam::v1::DTYPE_F32 || st.shape != want) {
        problems_.Add(absl::StrCat("FP8 scale tensor ", scale, " is ", DTypeName(st.dtype), " ",
                                   FormatShape(st.shape), " but ", Name(n), " ",
                                   FormatShape(w.shape), " needs f32 ", FormatShape(want),
                                   " (one scale per 128x128 block)"));
        info.bad = true;
      }
    }
    for (int32_t n : dst_names_) {
      NameInfo& info = infos_[n];
      if (info.parts.empty() && !info.derived_scale && !info.bad) {
        problems_.Add(absl::StrCat("destination ", Name(n), " (", Who(info.dst[0]),
                                   ") has no source tensor"));
        info.bad = true;
      }
    }
  }

  void Resolve(int32_t n) {
    NameInfo& info = infos_[n];
    info.phase = LayerPhase(names_[n], options_.layers_per_phase);
    if (info.bad) return;
    const TensorEntry& d = E(info.dst[0]);
    std::string name(Name(n));
    int32_t direct = FindSource(name);
    if (direct >= 0) {
      if (infos_[direct].bad) {
        info.bad = true;
        return;
      }
      const TensorEntry& s = E(infos_[direct].src[0]);
      if (s.shape != d.shape) {
        problems_.Add(absl::StrCat("shape mismatch for ", name, ": destination ",
                                   FormatShape(d.shape), " on ", Who(info.dst[0]), ", source ",
                                   SrcWho(direct)));
        info.bad = true;
        return;
      }
      info.parts.push_back(Part{direct, 0});
      SetTransform(n, s.dtype);
      return;
    }
    for (const config::FusionRule& rule : options_.fusions) {
      if (name.size() < rule.fused.size() ||
          name.compare(name.size() - rule.fused.size(), rule.fused.size(), rule.fused) != 0) {
        continue;
      }
      std::string prefix = name.substr(0, name.size() - rule.fused.size());
      std::vector<std::string> missing;
      std::vector<int32_t> ids;
      for (const std::string& p : rule.parts) {
        int32_t id = FindSource(prefix + p);
        if (id < 0) missing.push_back(prefix + p);
        ids.push_back(id);
      }
      if (!missing.empty()) {
        if (missing.size() == rule.parts.size()) continue;  // not this rule's tensor at all
        problems_.Add(absl::StrCat("fused destination ", name, " (", Who(info.dst[0]),
                                   "): fusion part(s) missing: ", absl::StrJoin(missing, ", ")));
        info.bad = true;
        return;
      }
      int dim = rule.dim;
      if (dim < 0 || dim >= static_cast<int>(d.shape.size())) {
        problems_.Add(absl::StrCat("fused destination ", name, ": fusion dim ", dim,
                                   " outside its shape ", FormatShape(d.shape)));
        info.bad = true;
        return;
      }
      int64_t offset = 0;
      bool ok = true;
      DType src_dtype = E(infos_[ids[0]].src[0]).dtype;
      for (int32_t id : ids) {
        if (infos_[id].bad) {
          info.bad = true;
          return;
        }
        const TensorEntry& s = E(infos_[id].src[0]);
        bool same = s.shape.size() == d.shape.size();
        for (size_t k = 0; same && k < d.shape.size(); ++k) {
          same = static_cast<int>(k) == dim || s.shape[k] == d.shape[k];
        }
        if (!same) ok = false;
        if (s.dtype != src_dtype) ok = false;
        info.parts.push_back(Part{id, offset});
        if (same) offset += s.shape[dim];
      }
      if (!ok || offset != d.shape[dim]) {
        std::string parts;
        for (int32_t id : ids) absl::StrAppend(&parts, "; ", SrcWho(id));
        problems_.Add(absl::StrCat(
            "fused destination ", name, " ", FormatShape(d.shape), " on ", Who(info.dst[0]),
            ": parts are inconsistent with a concat along dim ", dim, parts));
        info.parts.clear();
        info.bad = true;
        return;
      }
      info.fusion_dim = dim;
      SetTransform(n, src_dtype);
      return;
    }
  }

  void SetTransform(int32_t n, DType src) {
    NameInfo& info = infos_[n];
    const TensorEntry& d = E(info.dst[0]);
    DType dst = d.dtype;
    if (src == dst) {
      info.transform = weightbeam::v1::TRANSFORM_COPY;
    } else if (IsFloat(src) && IsFloat(dst)) {
      info.transform = weightbeam::v1::TRANSFORM_CAST;
    } else if (src == weightbeam::v1::DTYPE_BF16 && dst == weightbeam::v1::DTYPE_F8_E4M3) {
      info.transform = weightbeam::v1::TRANSFORM_FP8_BLOCK;
      if (d.shape.size() != 2) {
        problems_.Add(absl::StrCat("FP8 destination ", Name(n), " ", FormatShape(d.shape),
                                   " must be 2-D for 128x128 block scaling"));
        info.bad = true;
      }
    } else {
      problems_.Add(absl::StrCat("no transform from ", DTypeName(src), " to ", DTypeName(dst),
                                 " for destination ", Name(n), " (", Who(info.dst[0]), ", source ",
                                 SrcWho(info.parts[0].src_name), ")"));
      info.bad = true;
    }
  }

  // The scale entry beside an FP8 destination entry: same agent and owner.
  int32_t FindScaleEntry(int32_t scale_name, EntryRef w) const {
    for (const EntryRef& r : infos_[scale_name].dst) {
      const Owner &a = E(r).owner, &b = E(w).owner;
      if (r.agent == w.agent && a.replica == b.replica && a.rank == b.rank) return r.tensor;
    }
    return -1;
  }

  void ReportFp8(int32_t n, const std::string& msg) {
    NameInfo& info = infos_[n];
    if (!info.fp8_error_reported) problems_.Add(msg);
    info.fp8_error_reported = true;
  }

  // Checks one FP8 destination entry and its scale entry; false when unusable.
  bool CheckFp8Entry(int32_t n, EntryRef ref, const Box& dbox, int32_t* scale_tensor) {
    const NameInfo& info = infos_[n];
    const TensorEntry& w = E(ref);
    for (int d = 0; d < 2; ++d) {
      int64_t cut = SplitBoundary(dbox, d, w.shape[d]);
      if (cut >= 0) {
        ReportFp8(
            n, absl::StrCat("FP8 destination ", Name(n), ": ", Who(ref), " holds ", BoxString(dbox),
                            " whose ", d == 0 ? "row" : "column", " boundary ", cut,
                            " splits a 128x128 scale block; FP8 destination shards must be "
                            "cut at multiples of 128"));
        return false;
      }
    }
    *scale_tensor = FindScaleEntry(info.scale_name, ref);
    if (*scale_tensor < 0) {
      ReportFp8(n, absl::StrCat("FP8 destination ", Name(n), " on ", Who(ref),
                                " has no scale tensor ", Name(info.scale_name), " beside it"));
      return false;
    }
    Box sbox = EntryBox(agents_[ref.agent].tensors[*scale_tensor]);
    Box want;
    want.ndim = 2;
    for (int d = 0; d < 2; ++d) {
      want.start[d] = dbox.start[d] / kFp8Block;
      want.size[d] = (dbox.End(d) + kFp8Block - 1) / kFp8Block - want.start[d];
    }
    if (!(sbox == want)) {
      ReportFp8(n, absl::StrCat("FP8 scale tensor ", Name(info.scale_name), " on ", Who(ref),
                                " holds blocks ", BoxString(sbox), " but its weight shard ",
                                BoxString(dbox), " needs blocks ", BoxString(want)));
      return false;
    }
    return true;
  }

  // Reserves each sender's op vector from a count of dim-0 overlaps (exact for the usual
  // 1-D/2-D cases), so that generation does not reallocate gigabytes at Kimi-K2 scale.
  void ReserveOps() {
    std::vector<uint64_t> count(agents_.size(), 0);
    for (int32_t n : dst_names_) {
      const NameInfo& info = infos_[n];
      if (info.bad || info.derived_scale || info.parts.empty()) continue;
      for (const EntryRef& dref : info.dst) {
        const TensorEntry& d = E(dref);
        const int64_t d0 = d.shard.empty() ? 0 : d.shard[0].start;
        const int64_t d1 = d.shard.empty() ? d.shape[0] : d0 + d.shard[0].size;
        for (const Part& part : info.parts) {
          const NameInfo& src = infos_[part.src_name];
          const int64_t off0 = info.fusion_dim == 0 ? part.offset : 0;
          const Slice* first = slices_.data() + src.slice_begin;
          const Slice* last = first + src.slice_count;
          const Slice* it =
              std::upper_bound(first, last, d0 - off0 - src.max_len0,
                               [](int64_t v, const Slice& s) { return v < s.start0; });
          for (; it != last && it->start0 + off0 < d1; ++it) {
            if (it->start0 + off0 + it->size0 > d0 && it->holder_count == 1) {
              ++count[holders_[it->holder_begin].agent];
            }
          }
        }
      }
    }
    plan_.ops.resize(agents_.size());
    for (size_t a = 0; a < agents_.size(); ++a) plan_.ops[a].reserve(count[a]);
  }

  void Generate() {
    ReserveOps();
    std::vector<Run> runs;
    for (int32_t n : dst_names_) {
      NameInfo& info = infos_[n];
      if (info.bad || info.derived_scale || info.parts.empty()) continue;
      const bool fp8 = info.transform == weightbeam::v1::TRANSFORM_FP8_BLOCK;
      const DType dst_dtype = E(info.dst[0]).dtype;
      const DType src_dtype = E(infos_[info.parts[0].src_name].src[0]).dtype;
      const uint64_t de = DTypeBytes(dst_dtype), se = DTypeBytes(src_dtype);
      const std::vector<int64_t>& shape = E(info.dst[0]).shape;
      const int fdim = info.fusion_dim;
      for (const EntryRef& dref : info.dst) {
        const Box dbox = EntryBox(E(dref));
        int32_t scale_tensor = -1;
        Box sbox;
        if (fp8) {
          if (!CheckFp8Entry(n, dref, dbox, &scale_tensor)) continue;
          sbox = EntryBox(agents_[dref.agent].tensors[scale_tensor]);
        }
        for (const Part& part : info.parts) {
          const NameInfo& src = infos_[part.src_name];
          const int64_t off0 = fdim == 0 ? part.offset : 0;
          const Slice* first = slices_.data() + src.slice_begin;
          const Slice* last = first + src.slice_count;
          const int64_t lo = dbox.start[0] - off0 - src.max_len0;
          const Slice* it = std::upper_bound(
              first, last, lo, [](int64_t v, const Slice& s) { return v < s.start0; });
          for (; it != last && it->start0 + off0 < dbox.End(0); ++it) {
            if (it->start0 + off0 + it->size0 <= dbox.start[0]) continue;
            const EntryRef holder = holders_[it->holder_begin];
            Box sb;
            if (it->ndim <= 2) {
              sb.ndim = it->ndim;
              sb.start[0] = it->start0, sb.size[0] = it->size0;
              sb.start[1] = it->start1, sb.size[1] = it->size1;
            } else {
              sb = EntryBox(E(holder));
            }
            sb.start[fdim] += part.offset;
            Box b;
            if (!Intersect(dbox, sb, &b)) continue;
            if (fp8) {
              for (int d = 0; d < 2; ++d) {
                int64_t cut = SplitBoundary(b, d, shape[d]);
                if (cut < 0) continue;
                ReportFp8(
                    n, absl::StrCat("FP8 destination ", Name(n), " (", Who(dref), "): source ",
                                    Name(part.src_name), " held by ", Who(holder), " as ",
                                    BoxString(EntryBox(E(holder))), " gives ",
                                    d == 0 ? "rows" : "columns", " [", b.start[d], ", ", b.End(d),
                                    ") of the destination, splitting the 128-",
                                    d == 0 ? "row" : "column", " block at ",
                                    d == 0 ? "row " : "column ", cut,
                                    "; FP8 block scaling needs each 128x128 block from one source, "
                                    "so source shards must be cut at multiples of 128"));
                break;
              }
              if (info.fp8_error_reported) break;
            }
            runs.clear();
            if (fp8) {
              // Keep the 2-D shape (never fold rows into one run): the executor computes
              // 128x128 block scales from rows x row_elems.
              Run r;
              r.rows = b.size[0];
              r.row_elems = b.size[1];
              r.src_offset = (b.start[0] - sb.start[0]) * sb.size[1] + (b.start[1] - sb.start[1]);
              r.src_stride = sb.size[1];
              r.dst_offset =
                  (b.start[0] - dbox.start[0]) * dbox.size[1] + (b.start[1] - dbox.start[1]);
              r.dst_stride = dbox.size[1];
              runs.push_back(r);
            } else {
              BoxRuns(b, sb, dbox, &runs);
            }
            for (const Run& r : runs) {
              PlannedOp op;
              op.src_offset = r.src_offset * se;
              op.src_stride = r.src_stride * se;
              op.dst_offset = r.dst_offset * de;
              op.dst_stride = r.dst_stride * de;
              op.rows = r.rows;
              op.row_elems = r.row_elems;
              op.dst_agent = dref.agent;
              op.dst_tensor = dref.tensor;
              op.phase = static_cast<int16_t>(info.phase);
              op.src_dtype = static_cast<uint8_t>(src_dtype);
              op.dst_dtype = static_cast<uint8_t>(dst_dtype);
              op.transform = static_cast<uint8_t>(info.transform);
              if (fp8) {
                op.scale_tensor = scale_tensor;
                op.scale_stride = static_cast<uint32_t>(sbox.size[1] * 4);
                op.scale_offset = ((b.start[0] / kFp8Block - sbox.start[0]) * sbox.size[1] +
                                   (b.start[1] / kFp8Block - sbox.start[1])) *
                                  4;
              }
              if (it->holder_count == 1) {
                op.src_agent = holder.agent;
                op.src_tensor = holder.tensor;
                plan_.ops[holder.agent].push_back(op);
              } else {
                pending_.push_back(PendingChoice{op, static_cast<int32_t>(it - slices_.data())});
              }
            }
          }
          if (info.fp8_error_reported) break;
        }
        if (info.fp8_error_reported) break;
      }
    }
  }

  // Devices: one per (agent, GPU) plus one per agent for host memory. Per tensor: its device
  // and a hash of its identity, in dense arrays so the passes over ops stay cache friendly.
  void BuildDevices() {
    dev_base_.assign(agents_.size() + 1, 0);
    tensor_dev_.resize(agents_.size());
    for (size_t a = 0; a < agents_.size(); ++a) {
      int32_t max_gpu = -1;
      for (const TensorEntry& t : agents_[a].tensors) max_gpu = std::max(max_gpu, t.gpu);
      dev_base_[a + 1] = dev_base_[a] + max_gpu + 2;
      tensor_dev_[a].resize(agents_[a].tensors.size());
      for (size_t t = 0; t < agents_[a].tensors.size(); ++t) {
        tensor_dev_[a][t] = dev_base_[a] + agents_[a].tensors[t].gpu + 1;
      }
    }
    // Rails of a device: its GPU's own NIC(s) by position among the agent's GPUs (GPU i of G
    // uses rails i, i+G, ...; with fewer NICs than GPUs, rail i mod N); host memory any rail.
    dev_rail_first_.assign(dev_base_.back(), 0);
    dev_rail_step_.assign(dev_base_.back(), 1);
    dev_rail_count_.assign(dev_base_.back(), 1);
    rail_base_.assign(agents_.size() + 1, 0);
    for (size_t a = 0; a < agents_.size(); ++a) {
      const int nics = std::max<int>(1, agents_[a].nics.size());
      rail_base_[a + 1] = rail_base_[a] + nics;
      std::vector<int32_t> gpus;
      for (const TensorEntry& t : agents_[a].tensors) {
        if (t.gpu >= 0) gpus.push_back(t.gpu);
      }
      std::sort(gpus.begin(), gpus.end());
      gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
      const int g = static_cast<int>(gpus.size());
      dev_rail_count_[dev_base_[a]] = nics;  // host memory
      for (int pos = 0; pos < g; ++pos) {
        const int32_t d = dev_base_[a] + gpus[pos] + 1;
        if (nics >= g) {
          dev_rail_first_[d] = pos, dev_rail_step_[d] = g,
          dev_rail_count_[d] = (nics - pos + g - 1) / g;
        } else {
          dev_rail_first_[d] = pos % nics;
        }
      }
    }
  }

  double RailGbps(int32_t agent, int rail) const {
    const auto& nics = agents_[agent].nics;
    if (rail < static_cast<int>(nics.size()) && nics[rail].gbps > 0) return nics[rail].gbps;
    return options_.cost.nic_gbps;
  }

  // Bytes-equivalent cost of an op on a sender (the per-op overhead at the NIC's rate).
  double OpCost(const PlannedOp& op) const {
    return static_cast<double>(op.DstBytes()) +
           options_.cost.op_overhead_us * 1e-6 * options_.cost.nic_gbps * 1e9;
  }

  // Greedy, largest first: each multi-holder op goes to its least loaded source device.
  void ChooseSources() {
    if (pending_.empty()) return;
    std::vector<double> load(dev_base_.back(), 0.0);
    for (const auto& ops : plan_.ops) {
      for (const PlannedOp& op : ops) load[tensor_dev_[op.src_agent][op.src_tensor]] += OpCost(op);
    }
    std::stable_sort(pending_.begin(), pending_.end(),
                     [&](const PendingChoice& a, const PendingChoice& b) {
                       return a.op.DstBytes() > b.op.DstBytes();
                     });
    for (PendingChoice& p : pending_) {
      PlannedOp& op = p.op;
      const Slice& s = slices_[p.slice];
      EntryRef best = holders_[s.holder_begin];
      double best_load = load[tensor_dev_[best.agent][best.tensor]];
      for (int32_t h = 1; h < s.holder_count; ++h) {
        EntryRef c = holders_[s.holder_begin + h];
        double l = load[tensor_dev_[c.agent][c.tensor]];
        if (l < best_load) best = c, best_load = l;
      }
      op.src_agent = best.agent;
      op.src_tensor = best.tensor;
      load[tensor_dev_[best.agent][best.tensor]] += OpCost(op);
      plan_.ops[best.agent].push_back(op);
    }
    pending_.clear();
    pending_.shrink_to_fit();
  }

  // Per sender, stable by (phase, destination agent rotated by the sender's position) so that
  // senders start on different receivers instead of all hitting the first one.
  void OrderOps() {
    const int32_t na = static_cast<int32_t>(agents_.size());
    int32_t phases = 1;
    for (const auto& ops : plan_.ops) {
      for (const PlannedOp& op : ops) phases = std::max<int32_t>(phases, op.phase + 1);
    }
    plan_.phases = phases;
    std::vector<uint64_t> key_count;
    OpList sorted;
    for (int32_t a = 0; a < na; ++a) {
      OpList& ops = plan_.ops[a];
      if (ops.empty()) continue;
      auto key = [&](const PlannedOp& op) {
        int32_t rot = (agent_rank_[op.dst_agent] - agent_rank_[a] + na) % na;
        return static_cast<size_t>(op.phase) * na + rot;
      };
      key_count.assign(static_cast<size_t>(phases) * na + 1, 0);
      for (const PlannedOp& op : ops) ++key_count[key(op) + 1];
      for (size_t k = 1; k < key_count.size(); ++k) key_count[k] += key_count[k - 1];
      // Sort through one scratch buffer reused by every sender (cache-warm, no page faults).
      if (sorted.size() < ops.size()) sorted.resize(ops.size());
      for (const PlannedOp& op : ops) sorted[key_count[key(op)]++] = op;
      std::copy(sorted.begin(), sorted.begin() + ops.size(), ops.begin());
    }
  }

  static double Imbalance(const std::vector<uint64_t>& v) {
    if (v.empty()) return 0;
    double sum = 0, mx = 0;
    for (uint64_t x : v) sum += x, mx = std::max<double>(mx, x);
    return sum > 0 ? mx / (sum / v.size()) : 0;
  }

  // One pass over the ordered ops: rails (least loaded of the source device's rails, in
  // execution order), statistics, and the hash (over names, owners, regions and op fields,
  // never over input positions).
  void Finish() {
    PlanStats& s = plan_.stats;
    const size_t na = agents_.size();
    s.send_bytes.assign(na, 0);
    s.send_ops.assign(na, 0);
    s.recv_bytes.assign(na, 0);
    s.recv_ops.assign(na, 0);
    s.is_sender.assign(na, false);
    s.is_receiver.assign(na, false);
    const size_t nd = dev_base_.back();
    std::vector<uint64_t> dev_send(nd, 0), dev_recv(nd, 0);
    std::vector<char> dev_src(nd, 0), dev_dst(nd, 0);
    std::vector<double> send_rail(rail_base_.back(), 0), recv_rail(rail_base_.back(), 0);
    std::vector<uint64_t> send_rail_ops(rail_base_.back(), 0);

    std::vector<uint64_t> name_hash(names_.size());
    for (size_t n = 0; n < names_.size(); ++n) name_hash[n] = HashString(names_[n]);
    std::vector<uint64_t> agent_hash(na);
    std::vector<std::vector<uint64_t>> tensor_hash(na);
    for (size_t a = 0; a < na; ++a) {
      agent_hash[a] = HashString(agents_[a].name);
      tensor_hash[a].resize(agents_[a].tensors.size());
      for (size_t t = 0; t < agents_[a].tensors.size(); ++t) {
        const TensorEntry& e = agents_[a].tensors[t];
        bool src = e.owner.role == Role::kTrainer;
        (src ? s.is_sender : s.is_receiver)[a] = true;
        (src ? dev_src : dev_dst)[tensor_dev_[a][t]] = 1;
        int32_t name = tensor_name_[a][t];
        uint64_t h = Mix(name < 0 ? 0 : name_hash[name], e.region);
        tensor_hash[a][t] = Mix(Mix(h, e.owner.replica), e.owner.rank);
      }
    }
    uint64_t h = Mix(0, plan_.phases);
    for (int32_t a : plan_.agent_order) {
      h = Mix(Mix(h, agent_hash[a]), plan_.ops[a].size());
      const int32_t rb = rail_base_[a];
      for (PlannedOp& op : plan_.ops[a]) {
        const uint64_t b = op.DstBytes();
        const int32_t sd = tensor_dev_[a][op.src_tensor];
        int best = dev_rail_first_[sd];
        for (int k = 1; k < dev_rail_count_[sd]; ++k) {
          int r = dev_rail_first_[sd] + k * dev_rail_step_[sd];
          if (send_rail[rb + r] < send_rail[rb + best]) best = r;
        }
        op.rail = static_cast<int16_t>(best);
        send_rail[rb + best] += b;
        send_rail_ops[rb + best] += 1;
        const int32_t dd = tensor_dev_[op.dst_agent][op.dst_tensor];
        const double share = static_cast<double>(b) / dev_rail_count_[dd];
        for (int k = 0; k < dev_rail_count_[dd]; ++k) {
          recv_rail[rail_base_[op.dst_agent] + dev_rail_first_[dd] + k * dev_rail_step_[dd]] +=
              share;
        }
        s.send_bytes[a] += b;
        s.send_ops[a] += 1;
        s.recv_bytes[op.dst_agent] += b;
        s.recv_ops[op.dst_agent] += 1;
        dev_send[sd] += b;
        dev_recv[dd] += b;
        s.total_bytes += b;
        s.total_ops += 1;

        // Word-wise polynomial over the op's fields, mixed once per op.
        uint64_t w = tensor_hash[a][op.src_tensor];
        w = w * kPrime + agent_hash[op.dst_agent];
        w = w * kPrime + tensor_hash[op.dst_agent][op.dst_tensor];
        w = w * kPrime + (op.scale_tensor >= 0 ? tensor_hash[op.dst_agent][op.scale_tensor] : 0);
        w = w * kPrime + op.src_offset;
        w = w * kPrime + op.src_stride;
        w = w * kPrime + op.dst_offset;
        w = w * kPrime + op.dst_stride;
        w = w * kPrime + op.rows;
        w = w * kPrime + op.row_elems;
        w = w * kPrime + op.scale_offset;
        w = w * kPrime + ((uint64_t{op.scale_stride} << 32) ^ (uint64_t{op.src_dtype} << 24) ^
                          (uint64_t{op.dst_dtype} << 16) ^ (uint64_t{op.transform} << 8));
        w = w * kPrime + ((uint64_t(uint16_t(op.rail)) << 16) | uint64_t(uint16_t(op.phase)));
        h = Mix(h, w);
      }
    }
    plan_.hash = h;
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
    plan_.hash_hex = buf;

    std::vector<uint64_t> senders, receivers;
    for (size_t a = 0; a < na; ++a) {
      if (s.is_sender[a]) senders.push_back(s.send_bytes[a]);
      if (s.is_receiver[a]) receivers.push_back(s.recv_bytes[a]);
    }
    for (size_t d = 0; d < nd; ++d) {
      if (dev_src[d]) s.sender_device_bytes.push_back(dev_send[d]);
      if (dev_dst[d]) s.receiver_device_bytes.push_back(dev_recv[d]);
    }
    s.sender_imbalance = Imbalance(senders);
    s.receiver_imbalance = Imbalance(receivers);
    s.sender_device_imbalance = Imbalance(s.sender_device_bytes);
    double step = 0;
    for (size_t a = 0; a < na; ++a) {
      for (int r = 0; r < rail_base_[a + 1] - rail_base_[a]; ++r) {
        const double gbps = RailGbps(a, r) * 1e9;
        const double send = send_rail[rail_base_[a] + r] / gbps +
                            send_rail_ops[rail_base_[a] + r] * options_.cost.op_overhead_us * 1e-6;
        step = std::max({step, send, recv_rail[rail_base_[a] + r] / gbps});
      }
    }
    s.predicted_step_seconds = step;
  }

  const std::vector<AgentLayout>& agents_;
  const PlanOptions& options_;
  Problems problems_;
  Plan plan_;
  std::vector<int32_t> agent_rank_;
  std::unordered_map<std::string_view, int32_t> name_ids_;
  std::vector<std::string_view> names_;
  std::vector<NameInfo> infos_;
  std::vector<std::vector<int32_t>> tensor_name_;
  std::vector<Slice> slices_;
  std::vector<EntryRef> holders_;
  std::unordered_map<std::string, int32_t> canonical_;
  std::vector<int32_t> dst_names_;
  std::vector<PendingChoice> pending_;
  std::vector<int32_t> dev_base_;
  std::vector<std::vector<int32_t>> tensor_dev_;
  std::vector<int32_t> dev_rail_first_, dev_rail_step_, dev_rail_count_;
  std::vector<int32_t> rail_base_;
};

}  // namespace

absl::StatusOr<Plan> BuildPlan(const std::vector<AgentLayout>& agents, const PlanOptions& options) {
  return Planner(agents, options).Build();
}

}  // namespace wb::planner
