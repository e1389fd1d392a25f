// Planner step: rename and fusion rules map each destination to its source part(s), with
// shape and transform checks and FP8 scale tensors.
#include <algorithm>
#include <cstdio>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parallel/parallel_for.h"
#include "common/planner/planner_internal.h"

namespace wb::planner {
namespace internal {

void Planner::ApplyRenames() {
  if (options_.renames.empty()) return;
  std::vector<std::string> errors;
  const RenameRules rules = RenameRules::Compile(options_.renames, &errors);
  for (std::string& e : errors) problems_.Add(std::move(e));
  for (size_t n = 0; n < infos_.size(); ++n) {
    if (infos_[n].src.empty()) continue;
    const std::string canonical = rules.Apply(std::string(Name(static_cast<int32_t>(n))));
    auto [it, inserted] = canonical_.try_emplace(canonical, static_cast<int32_t>(n));
    if (!inserted) {
      problems_.Add(absl::StrCat("sources ", Name(it->second), " and ", Name(n),
                                 " both map to destination name ", canonical));
    }
  }
}

int32_t Planner::FindSource(const std::string& dst_name) const {
  if (!options_.renames.empty()) {
    auto it = canonical_.find(dst_name);
    return it == canonical_.end() ? -1 : it->second;
  }
  const int32_t id = NameId(dst_name);
  if (id < 0 || infos_[id].src.empty()) return -1;
  return id;
}

std::string Planner::SrcWho(int32_t src_name) const {
  return absl::StrCat(Name(src_name), " ", FormatShape(E(infos_[src_name].src[0]).shape), " ",
                      DTypeName(E(infos_[src_name].src[0]).dtype), " on ",
                      Who(infos_[src_name].src[0]));
}

void Planner::ResolveRecipes() {
  // Destination names in canonical (sorted) order: generation follows it.
  for (size_t n = 0; n < infos_.size(); ++n) {
    if (!infos_[n].dst.empty()) dst_names_.push_back(static_cast<int32_t>(n));
  }
  // 10^6 names: ~0.8 s on one thread (each comparison reads two names from far apart).
  ParallelSort(&dst_names_, Threads(), [&](int32_t a, int32_t b) { return Name(a) < Name(b); });
  // Each name resolves on its own (problems per shard, joined in name order); the sources'
  // check results are read from a snapshot, as another name's `bad` may change meanwhile.
  checked_bad_.resize(infos_.size());
  for (size_t i = 0; i < infos_.size(); ++i) checked_bad_[i] = infos_[i].bad;
  std::vector<uint64_t> work(dst_names_.size(), 1);
  const auto shards = SplitByWork(work, Threads());
  std::vector<Problems> found(shards.size());
  ParallelFor(shards.size(), Threads(), [&](uint64_t i) {
    for (size_t k = shards[i].first; k < shards[i].second; ++k) Resolve(&found[i], dst_names_[k]);
  });
  for (const Problems& p : found) problems_.Merge(p);
  // Scale tensors of FP8-block destinations are written by the weight's ops. A weight's scale
  // name is its own (name + "_scale_inv"), so the shards mark disjoint names.
  std::vector<Problems> scale_found(shards.size());
  ParallelFor(shards.size(), Threads(), [&](uint64_t i) {
    for (size_t k = shards[i].first; k < shards[i].second; ++k) {
      ResolveScale(&scale_found[i], dst_names_[k]);
    }
  });
  for (const Problems& p : scale_found) problems_.Merge(p);
  for (int32_t n : dst_names_) {
    NameInfo& info = infos_[n];
    if (info.parts.empty() && !info.derived_scale && !info.bad) {
      problems_.Add(
          absl::StrCat("destination ", Name(n), " (", Who(info.dst[0]), ") has no source tensor"));
      info.bad = true;
    }
  }
}

void Planner::ResolveScale(Problems* out, int32_t n) {
  NameInfo& info = infos_[n];
  if (info.transform != weightbeam::v1::TRANSFORM_FP8_BLOCK) return;
  std::string scale = ScaleTensorName(Name(n));
  const int32_t scale_id = NameId(scale);
  const TensorEntry& w = E(info.dst[0]);
  if (scale_id < 0 || infos_[scale_id].dst.empty()) {
    out->Add(absl::StrCat("FP8 destination ", Name(n), " (", Who(info.dst[0]),
                          ") has no scale tensor ", scale));
    info.bad = true;
    return;
  }
  NameInfo& s = infos_[scale_id];
  s.derived_scale = true;
  info.scale_name = scale_id;
  const TensorEntry& st = E(s.dst[0]);
  std::vector<int64_t> want = {(w.shape[0] + kFp8Block - 1) / kFp8Block,
                               (w.shape[1] + kFp8Block - 1) / kFp8Block};
  if (st.dtype != weightbeam::v1::DTYPE_F32 || st.shape != want) {
    out->Add(absl::StrCat("FP8 scale tensor ", scale, " is ", DTypeName(st.dtype), " ",
                          FormatShape(st.shape), " but ", Name(n), " ", FormatShape(w.shape),
                          " needs f32 ", FormatShape(want), " (one scale per 128x128 block)"));
    info.bad = true;
  }
}

void Planner::Resolve(Problems* out, int32_t n) {
  NameInfo& info = infos_[n];
  info.phase = LayerPhase(names_[n], options_.layers_per_phase);
  if (info.bad) return;
  const TensorEntry& d = E(info.dst[0]);
  std::string name(Name(n));
  // Without renames a direct source has the destination's name, hence its name id.
  int32_t direct = options_.renames.empty() ? (infos_[n].src.empty() ? -1 : n) : FindSource(name);
  if (direct >= 0) {
    if (checked_bad_[direct]) {
      info.bad = true;
      return;
    }
    const TensorEntry& s = E(infos_[direct].src[0]);
    if (s.shape != d.shape) {
      out->Add(absl::StrCat("shape mismatch for ", name, ": destination ", FormatShape(d.shape),
                            " on ", Who(info.dst[0]), ", source ", SrcWho(direct)));
      info.bad = true;
      return;
    }
    info.parts.push_back(Part{direct, 0});
    SetTransform(out, n, s.dtype);
    return;
  }
  for (const FusionRule& rule : options_.fusions) {
    const auto part_names = FusionPartNames(name, rule);
    if (!part_names) continue;
    std::vector<std::string> missing;
    std::vector<int32_t> ids;
    for (const std::string& part : *part_names) {
      int32_t id = FindSource(part);
      if (id < 0) missing.push_back(part);
      ids.push_back(id);
    }
    if (!missing.empty()) {
      if (missing.size() == rule.parts.size()) continue;  // not this rule's tensor at all
      out->Add(absl::StrCat("fused destination ", name, " (", Who(info.dst[0]),
                            "): fusion part(s) missing: ", absl::StrJoin(missing, ", ")));
      info.bad = true;
      return;
    }
    int dim = rule.dim;
    if (dim < 0 || dim >= static_cast<int>(d.shape.size())) {
      out->Add(absl::StrCat("fused destination ", name, ": fusion dim ", dim, " outside its shape ",
                            FormatShape(d.shape)));
      info.bad = true;
      return;
    }
    int64_t offset = 0;
    bool ok = true;
    DType src_dtype = E(infos_[ids[0]].src[0]).dtype;
    for (int32_t id : ids) {
      if (checked_bad_[id]) {
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
      out->Add(absl::StrCat("fused destination ", name, " ", FormatShape(d.shape), " on ",
                            Who(info.dst[0]), ": parts are inconsistent with a concat along dim ",
                            dim, parts));
      info.parts.clear();
      info.bad = true;
      return;
    }
    info.fusion_dim = dim;
    SetTransform(out, n, src_dtype);
    return;
  }
}

void Planner::SetTransform(Problems* out, int32_t n, DType src) {
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
      out->Add(absl::StrCat("FP8 destination ", Name(n), " ", FormatShape(d.shape),
                            " must be 2-D for 128x128 block scaling"));
      info.bad = true;
    }
  } else {
    out->Add(absl::StrCat("no transform from ", DTypeName(src), " to ", DTypeName(dst),
                          " for destination ", Name(n), " (", Who(info.dst[0]), ", source ",
                          SrcWho(info.parts[0].src_name), ")"));
    info.bad = true;
  }
}

}  // namespace internal

}  // namespace wb::planner
