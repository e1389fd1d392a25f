// BuildPlan: index -> validate -> match names -> intersect shards -> choose sources ->
// order into phases -> rails, statistics and hash. See README.md. This file: the driver and
// the index of entries by name.
#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/parallel/parallel_for.h"
#include "common/planner/planner_internal.h"

namespace wb::planner {
uint64_t PlannedOp::DstBytes() const {
  uint64_t bytes = rows * row_elems * static_cast<uint64_t>(DTypeBytes(DstDType()));
  if (transform == weightbeam::v1::TRANSFORM_FP8_BLOCK) {
    bytes += ((rows + kFp8Block - 1) / kFp8Block) * ((row_elems + kFp8Block - 1) / kFp8Block) * 4;
  }
  return bytes;
}

OpList ExecutedOps(const Plan& plan, int32_t agent) {
  OpList out;
  ForEachExecutedOp(plan, agent, [&](const PlannedOp& op) { out.push_back(op); });
  return out;
}

namespace internal {

bool Planner::IndexMirrors() {
  const size_t na = agents_.size();
  holder_.resize(na);
  delta_.assign(na, 0);
  mirrors_.assign(na, {});
  const std::string problem = MirrorProblem(agents_);
  if (!problem.empty()) {
    problems_.Add(problem);
    return false;
  }
  for (size_t a = 0; a < na; ++a) {
    const int32_t of = agents_[a].mirror.of;
    holder_[a] = of >= 0 ? &agents_[of] : &agents_[a];
    if (of < 0) continue;
    delta_[a] = agents_[a].mirror.replica_delta;
    mirrors_[of].push_back(static_cast<int32_t>(a));
  }
  plan_.mirrors = mirrors_;  // fan-out groups list a template's entry for its mirrors too
  return true;
}

void Planner::OrderAgents() {
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

void Planner::IndexEntries() {
  // One parallel pass over contiguous runs of agents checks every entry (problems per agent,
  // joined in agent order) and counts, per interned name, the run's sources and destinations
  // and where the name first appears. Names are then numbered in order of first appearance,
  // each name's entries get one range of the flat lists (run after run, so in agent then
  // tensor order, as one serial pass would list them), and a second parallel pass fills them.
  const size_t na = agents_.size();
  const int threads = Threads();
  std::vector<uint64_t> work(na);
  uint64_t entries = 0;
  for (size_t a = 0; a < na; ++a) {
    work[a] = agents_[a].tensors.size() + 1;
    entries += agents_[a].tensors.size();
  }
  // Every entry's name was interned before this call, so its id is below Count().
  const size_t interned = TensorName::Count();
  // A run holds 16 bytes per interned name, and the table holds every name this process has
  // seen (a long-lived controller: maybe far more than this plan's): one run per thread while
  // that fits in 64 MiB plus 32 bytes per entry, fewer otherwise.
  const uint64_t budget = (uint64_t{64} << 20) + 32 * entries;
  const uint64_t per_run = 16 * std::max<uint64_t>(interned, 1);
  const int parts = static_cast<int>(std::clamp<uint64_t>(budget / per_run, 1, threads));
  const auto runs = SplitByWork(work, parts);
  constexpr uint64_t kNever = ~uint64_t{0};
  struct Run {
    std::vector<uint32_t> src, dst;  // per interned name: count, then the next slot to fill
    std::vector<uint64_t> first;     // per interned name: (agent << 32 | tensor) or kNever
    std::vector<EntryRef> views;     // usable destination entries with a buffer view
  };
  std::vector<Run> run(runs.size());
  std::vector<Problems> problems(na);
  tensor_name_.resize(na);
  // tensor_name_ holds the interned id meanwhile: id for an entry holding elements, -2 - id for
  // one holding none (named, in no list), -1 for an unusable entry.
  ParallelFor(runs.size(), threads, [&](uint64_t r) {
    Run& mine = run[r];
    mine.src.assign(interned, 0);
    mine.dst.assign(interned, 0);
    mine.first.assign(interned, kNever);
    for (size_t ai = runs[r].first; ai < runs[r].second; ++ai) {
      const AgentLayout& agent = agents_[ai];
      std::vector<int32_t>& names = tensor_name_[ai];
      names.assign(agent.tensors.size(), -1);
      for (size_t ti = 0; ti < agent.tensors.size(); ++ti) {
        int64_t v = 0;
        const EntryRef ref{static_cast<int32_t>(ai), static_cast<int32_t>(ti)};
        if (!CheckEntry(&problems[ai], ref, &v)) continue;
        const TensorEntry& t = agent.tensors[ti];
        if (!t.view.empty() && t.owner.role == Role::kInference) mine.views.push_back(ref);
        const uint32_t id = t.name.id();
        if (mine.first[id] == kNever) mine.first[id] = uint64_t{ai} << 32 | ti;
        if (v == 0) {  // holds nothing
          names[ti] = -2 - static_cast<int32_t>(id);
          continue;
        }
        names[ti] = static_cast<int32_t>(id);
        ++(t.owner.role == Role::kTrainer ? mine.src : mine.dst)[id];
      }
    }
  });
  for (const Problems& p : problems) problems_.Merge(p);
  view_entries_.clear();
  for (Run& r : run) {
    view_entries_.insert(view_entries_.end(), r.views.begin(), r.views.end());
    std::vector<EntryRef>().swap(r.views);
  }
  // Names in order of first appearance.
  std::vector<std::pair<uint64_t, uint32_t>> firsts;
  for (uint32_t id = 0; id < interned; ++id) {
    for (const Run& r : run) {
      if (r.first[id] == kNever) continue;
      firsts.emplace_back(r.first[id], id);
      break;  // runs are in agent order: the first run holding the name saw it first
    }
  }
  for (Run& r : run) std::vector<uint64_t>().swap(r.first);
  std::sort(firsts.begin(), firsts.end());
  name_ids_.assign(interned, -1);
  names_.reserve(firsts.size());
  infos_.resize(firsts.size());
  uint64_t src_total = 0, dst_total = 0;
  for (const auto& [pos, id] : firsts) {
    const int32_t n = static_cast<int32_t>(names_.size());
    name_ids_[id] = n;
    names_.push_back(std::string_view(agents_[pos >> 32].tensors[pos & 0xffffffffu].name.str()));
    // The runs' counts become their first slots in the name's ranges.
    const uint64_t src_begin = src_total, dst_begin = dst_total;
    for (Run& r : run) {
      const uint32_t s = r.src[id], d = r.dst[id];
      r.src[id] = static_cast<uint32_t>(src_total);
      r.dst[id] = static_cast<uint32_t>(dst_total);
      src_total += s;
      dst_total += d;
    }
    infos_[n].src = EntryRefs(src_begin, src_total - src_begin);
    infos_[n].dst = EntryRefs(dst_begin, dst_total - dst_begin);
  }
  src_refs_.resize(src_total);
  dst_refs_.resize(dst_total);
  for (NameInfo& info : infos_) {
    info.src.Bind(src_refs_.data());
    info.dst.Bind(dst_refs_.data());
  }
  ParallelFor(runs.size(), threads, [&](uint64_t r) {
    Run& mine = run[r];
    for (size_t ai = runs[r].first; ai < runs[r].second; ++ai) {
      const AgentLayout& agent = agents_[ai];
      std::vector<int32_t>& names = tensor_name_[ai];
      for (size_t ti = 0; ti < names.size(); ++ti) {
        const int32_t id = names[ti];
        if (id == -1) continue;
        if (id < -1) {
          names[ti] = name_ids_[-2 - id];
          continue;
        }
        names[ti] = name_ids_[id];
        const EntryRef ref{static_cast<int32_t>(ai), static_cast<int32_t>(ti)};
        if (agent.tensors[ti].owner.role == Role::kTrainer) {
          src_refs_[mine.src[id]++] = ref;
        } else {
          dst_refs_[mine.dst[id]++] = ref;
        }
      }
    }
  });
}

namespace {

// What is wrong with an entry's view (empty when nothing): ranks, offsets, extents and a
// buffer volume that fits in 62 bits, so that offsets computed from it cannot overflow.
std::string CheckView(const TensorEntry& t) {
  const BufferView& v = t.view;
  const size_t n = v.shape.size(), k = t.shape.size();
  if (n > static_cast<size_t>(kMaxDims) || k > n || v.offset.size() != n) {
    return absl::StrCat("shape ", FormatShape(v.shape), " and offset ", FormatShape(v.offset),
                        " do not place a ", k, "-D shard in a buffer of 1 to ", kMaxDims,
                        " dimensions");
  }
  const Box held = EntryBox(t);
  uint64_t volume = 1;
  for (size_t d = 0; d < n; ++d) {
    const int64_t extent = v.shape[d];
    const int64_t size = d < n - k ? 1 : held.size[d - (n - k)];
    if (extent <= 0 || volume > (uint64_t{1} << 62) / static_cast<uint64_t>(extent)) {
      return absl::StrCat("shape ", FormatShape(v.shape), " is empty or too large");
    }
    volume *= static_cast<uint64_t>(extent);
    if (v.offset[d] < 0 || size > extent || v.offset[d] > extent - size) {
      return absl::StrCat("the shard spans [", v.offset[d], ", ", v.offset[d], " + ", size,
                          ") of buffer dimension ", d, " whose extent is ", extent);
    }
  }
  return "";
}

}  // namespace

int32_t Planner::NameId(absl::string_view name) const {
  const std::optional<TensorName> interned = TensorName::Find(name);
  // A name interned by another thread after IndexEntries is held by no entry of this call.
  if (!interned || interned->id() >= name_ids_.size()) return -1;
  return name_ids_[interned->id()];
}

bool Planner::CheckEntry(Problems* out, EntryRef ref, int64_t* volume) {
  const TensorEntry& t = E(ref);
  auto fail = [&](const std::string& why) {
    out->Add(absl::StrCat("tensor ", t.name.str(), " (", Who(ref), "): ", why));
    return false;
  };
  if (t.name.empty()) return fail("empty name");
  if (DTypeBytes(t.dtype) == 0) return fail("unknown dtype");
  if (t.shape.empty() || t.shape.size() > kMaxDims) {
    return fail(
        absl::StrCat("shape ", FormatShape(t.shape), " must have 1 to ", kMaxDims, " dimensions"));
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
  int64_t held = 1;  // the shard's elements (checked inside the shape above)
  for (size_t d = 0; d < t.shape.size(); ++d)
    held *= t.shard.empty() ? t.shape[d] : t.shard[d].size;
  *volume = held;
  uint64_t need = static_cast<uint64_t>(*volume * DTypeBytes(t.dtype));
  if (!t.view.empty()) {
    // Sources may be views too (a trainer's own tensor holding boxes of several HF tensors).
    const std::string bad = CheckView(t);
    if (!bad.empty()) return fail(absl::StrCat("view of buffer ", t.view.buffer.str(), ": ", bad));
    need = static_cast<uint64_t>(DTypeBytes(t.dtype));
    for (int64_t s : t.view.shape) need *= static_cast<uint64_t>(s);
  }
  if (t.region_bytes < need) {
    return fail(absl::StrCat("region ", t.region, " has ", t.region_bytes,
                             " bytes but the shard needs ", need));
  }
  return true;
}

}  // namespace internal

absl::StatusOr<Plan> BuildPlan(const std::vector<AgentLayout>& agents, const PlanOptions& options) {
  // Without fan-out every destination gets its own ops: mirrors are planned as full layouts
  // (the same agent and entry indices), which is what that mode exists to compare against.
  if (!options.fan_out && std::any_of(agents.begin(), agents.end(),
                                      [](const AgentLayout& a) { return a.IsMirror(); })) {
    const std::string problem = MirrorProblem(agents);
    if (!problem.empty()) {  // the same refusal as with fan-out
      Problems problems;
      problems.Add(problem);
      return problems.ToStatus();
    }
    const std::vector<AgentLayout> full = UnfoldMirrors(agents);
    return internal::Planner(full, options).Build();
  }
  return internal::Planner(agents, options).Build();
}

}  // namespace wb::planner
