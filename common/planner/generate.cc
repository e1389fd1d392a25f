// Planner step: intersect destination shards with source slices into ops (FP8 block checks).
#include <algorithm>
#include <cstdio>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parallel/parallel_for.h"
#include "common/planner/planner_internal.h"

namespace wb::planner {
namespace internal {

int32_t Planner::FindScaleEntry(int32_t scale_name, EntryRef w, size_t hint) const {
  // Weights and scales are sorted alike (replica, rank, agent), so the weight's position is
  // nearly always the scale's: without it, a name held by R ranks costs R^2 / 2 compares.
  const EntryRefs& scales = infos_[scale_name].dst;
  if (hint < scales.size()) {
    const EntryRef r = scales[hint];
    const Owner &a = E(r).owner, &b = E(w).owner;
    if (r.agent == w.agent && a.replica == b.replica && a.rank == b.rank) return r.tensor;
  }
  for (const EntryRef& r : scales) {
    const Owner &a = E(r).owner, &b = E(w).owner;
    if (r.agent == w.agent && a.replica == b.replica && a.rank == b.rank) return r.tensor;
  }
  return -1;
}

void Planner::ReportFp8(Problems* out, int32_t n, const std::string& msg) {
  NameInfo& info = infos_[n];
  if (!info.fp8_error_reported) out->Add(msg);
  info.fp8_error_reported = true;
}

bool Planner::CheckFp8View(Problems* out, int32_t n, EntryRef ref, const Box& dbox,
                           EntryRef scale) {
  const TensorEntry& w = E(ref);
  const TensorEntry& s = E(scale);
  const BufferView& v = w.view;
  const int nb = static_cast<int>(v.shape.size());
  // Only for an error: built for every FP8 part, it cost more than the checks.
  auto where = [&] {
    return absl::StrCat("FP8 destination buffer ", v.buffer.str(), " (", Who(ref), "): part ",
                        Name(n), " ", BoxString(dbox), " at ", FormatShape(v.offset));
  };
  for (int d = 0; d < 2; ++d) {
    const int bd = nb - 2 + d;  // the buffer dimension this tensor dimension maps onto
    const char* what = d == 0 ? "row" : "column";
    std::string cut;
    if (dbox.start[d] % kFp8Block != 0) {
      cut = absl::StrCat("starts at source ", what, " ", dbox.start[d]);
    } else if (v.offset[bd] % kFp8Block != 0) {
      cut = absl::StrCat("lands at buffer ", what, " ", v.offset[bd]);
    } else if (dbox.size[d] % kFp8Block != 0 && dbox.End(d) != w.shape[d] &&
               v.offset[bd] + dbox.size[d] != v.shape[bd]) {
      cut = absl::StrCat("ends at buffer ", what, " ", v.offset[bd] + dbox.size[d],
                         ", inside a block and before the end of the tensor and the buffer");
    }
    if (!cut.empty()) {
      ReportFp8(out, n,
                absl::StrCat(where(), " ", cut,
                             ": it cuts a 128x128 scale block of the buffer; "
                             "parts of an FP8 buffer must start, land and end on multiples of "
                             "128 (or the tensor's or buffer's end)"));
      return false;
    }
  }
  // The scale part: at the weight's blocks inside a scale buffer of the weight buffer's blocks.
  std::vector<int64_t> want_shape(v.shape.begin(), v.shape.end() - 2);
  std::vector<int64_t> want_offset(v.offset.begin(), v.offset.end() - 2);
  for (int d = nb - 2; d < nb; ++d) {
    want_shape.push_back((v.shape[d] + kFp8Block - 1) / kFp8Block);
    want_offset.push_back(v.offset[d] / kFp8Block);
  }
  if (s.view.shape != want_shape || s.view.offset != want_offset) {
    ReportFp8(out, n,
              absl::StrCat(where(), ": its scale part ", s.name.str(), " is ",
                           s.view.empty() ? std::string("not a view")
                                          : absl::StrCat("at ", FormatShape(s.view.offset),
                                                         " of scale buffer ", s.view.buffer.str(),
                                                         " ", FormatShape(s.view.shape)),
                           " but must sit at ", FormatShape(want_offset), " of a scale buffer ",
                           FormatShape(want_shape), " (one f32 per 128x128 block)"));
    return false;
  }
  return true;
}

bool Planner::CheckFp8Entry(Problems* out, int32_t n, EntryRef ref, const Box& dbox,
                            int32_t* scale_tensor, size_t position) {
  const NameInfo& info = infos_[n];
  const TensorEntry& w = E(ref);
  for (int d = 0; w.view.empty() && d < 2; ++d) {  // views: CheckFp8View
    int64_t cut = SplitBoundary(dbox, d, w.shape[d]);
    if (cut >= 0) {
      ReportFp8(
          out, n,
          absl::StrCat("FP8 destination ", Name(n), ": ", Who(ref), " holds ", BoxString(dbox),
                       " whose ", d == 0 ? "row" : "column", " boundary ", cut,
                       " splits a 128x128 scale block; FP8 destination shards must be "
                       "cut at multiples of 128"));
      return false;
    }
  }
  *scale_tensor = FindScaleEntry(info.scale_name, ref, position);
  if (*scale_tensor < 0) {
    ReportFp8(out, n,
              absl::StrCat("FP8 destination ", Name(n), " on ", Who(ref), " has no scale tensor ",
                           Name(info.scale_name), " beside it"));
    return false;
  }
  if (!w.view.empty() && !CheckFp8View(out, n, ref, dbox, EntryRef{ref.agent, *scale_tensor})) {
    return false;
  }
  Box sbox = EntryBox(E(ref.agent, *scale_tensor));
  Box want;
  want.ndim = 2;
  for (int d = 0; d < 2; ++d) {
    want.start[d] = dbox.start[d] / kFp8Block;
    want.size[d] = (dbox.End(d) + kFp8Block - 1) / kFp8Block - want.start[d];
  }
  if (!(sbox == want)) {
    ReportFp8(out, n,
              absl::StrCat("FP8 scale tensor ", Name(info.scale_name), " on ", Who(ref),
                           " holds blocks ", BoxString(sbox), " but its weight shard ",
                           BoxString(dbox), " needs blocks ", BoxString(want)));
    return false;
  }
  return true;
}

Placement SourcePlacement(const TensorEntry& holder, const Box& slice_box) {
  if (holder.view.empty()) return DensePlacement(slice_box);
  Placement p = EntryPlacement(holder);
  p.held = slice_box;  // the same box, in destination coordinates (a fusion part's offset)
  return p;
}

void Planner::SliceBox(const Slice& slice, int fdim, int64_t offset, Box* out) const {
  Box& sb = *out;  // only its first ndim dimensions are set: callers read no further
  if (slice.ndim <= 2) {
    sb.ndim = slice.ndim;
    sb.start[0] = slice.start0, sb.size[0] = slice.size0;
    sb.start[1] = slice.start1, sb.size[1] = slice.size1;
  } else {
    sb = EntryBox(E(holders_[slice.holder_begin]));
  }
  sb.start[fdim] += offset;
}

size_t Planner::OrderKey(int32_t src_agent, int32_t dst_agent, int32_t phase) const {
  const int32_t na = static_cast<int32_t>(agents_.size());
  int32_t rot = agent_rank_[dst_agent] - agent_rank_[src_agent];
  if (rot < 0) rot += na;
  return static_cast<size_t>(phase) * na + rot;
}

void Planner::CountPhases() {
  phases_ = 1;
  for (int32_t n : dst_names_) {
    const NameInfo& info = infos_[n];
    if (!info.bad && !info.derived_scale && !info.parts.empty()) {
      phases_ = std::max(phases_, info.phase + 1);
    }
  }
  plan_.ops.assign(agents_.size(), {});
}

void Planner::GenerateShard(GenShard* g) {
  Problems* out = &g->generate_problems;
  std::vector<Run> runs;
  // Reused for every slice: a Box or Placement is hundreds of bytes, cleared when declared.
  Box sb, b;
  Placement splace;
  for (size_t k = g->begin; k < g->end; ++k) {
    const int32_t n = dst_names_[k];
    NameInfo& info = infos_[n];
    if (info.bad || info.derived_scale || info.parts.empty()) continue;
    const bool fp8 = info.transform == weightbeam::v1::TRANSFORM_FP8_BLOCK;
    const DType dst_dtype = E(info.dst[0]).dtype;
    const DType src_dtype = E(infos_[info.parts[0].src_name].src[0]).dtype;
    const uint64_t de = DTypeBytes(dst_dtype), se = DTypeBytes(src_dtype);
    const auto& shape = E(info.dst[0]).shape;
    const int fdim = info.fusion_dim;
    // One pass per destination class (GroupDestinations checked its FP8 entries): the ops
    // are the leader's, fanned out to the class's members.
    for (const DstClass& cls : info.classes) {
      const EntryRef dref = cls.leader;
      const TensorEntry& dentry = E(dref);
      const Box dbox = EntryBox(dentry);
      const Placement dplace = EntryPlacement(dentry);
      const int32_t scale_tensor = cls.scale_tensor;
      if (fp8) splace = EntryPlacement(E(dref.agent, scale_tensor));
      for (const Part& part : info.parts) {
        const NameInfo& src = infos_[part.src_name];
        const int64_t off0 = fdim == 0 ? part.offset : 0;
        const Slice* first = slices_.get() + src.slice_begin;
        const Slice* last = first + src.slice_count;
        const int64_t lo = dbox.start[0] - off0 - src.max_len0;
        const Slice* it = std::upper_bound(first, last, lo,
                                           [](int64_t v, const Slice& s) { return v < s.start0; });
        for (; it != last && it->start0 + off0 < dbox.End(0); ++it) {
          if (it->start0 + off0 + it->size0 <= dbox.start[0]) continue;
          const EntryRef holder = holders_[it->holder_begin];
          SliceBox(*it, fdim, part.offset, &sb);
          if (!Intersect(dbox, sb, &b)) continue;
          // The first holder's placement: ChooseSources picks only among holders placed alike.
          const Placement src_place = SourcePlacement(E(holder), sb);
          if (fp8) {
            for (int d = 0; d < 2; ++d) {
              // A view part was checked whole (CheckFp8View): its own end may be ragged.
              int64_t cut = SplitBoundary(b, d, dentry.view.empty() ? shape[d] : dbox.End(d));
              if (cut < 0) continue;
              ReportFp8(
                  out, n,
                  absl::StrCat(
                      "FP8 destination ", Name(n), " (", Who(dref), "): source ",
                      Name(part.src_name), " held by ", Who(holder), " as ",
                      BoxString(EntryBox(E(holder))), " gives ", d == 0 ? "rows" : "columns", " [",
                      b.start[d], ", ", b.End(d), ") of the destination, splitting the 128-",
                      d == 0 ? "row" : "column", " block at ", d == 0 ? "row " : "column ", cut,
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
            r.src_offset = src_place.base + (b.start[0] - sb.start[0]) * src_place.stride[0] +
                           (b.start[1] - sb.start[1]) * src_place.stride[1];
            r.src_stride = src_place.stride[0];
            r.dst_offset = dplace.base + (b.start[0] - dbox.start[0]) * dplace.stride[0] +
                           (b.start[1] - dbox.start[1]) * dplace.stride[1];
            r.dst_stride = dplace.stride[0];
            runs.push_back(r);
          } else {
            BoxRuns(b, src_place, dplace, &runs);
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
            op.fanout = cls.fanout;
            op.phase = static_cast<int16_t>(info.phase);
            op.src_dtype = static_cast<uint8_t>(src_dtype);
            op.dst_dtype = static_cast<uint8_t>(dst_dtype);
            op.transform = static_cast<uint8_t>(info.transform);
            if (fp8) {
              op.scale_tensor = scale_tensor;
              // The op's first block in scale-tensor coordinates, placed like any element of
              // the scale part (a view's scale part sits at the weight's blocks).
              const Box& sbox = splace.held;
              op.scale_stride = static_cast<uint32_t>(splace.stride[0] * 4);
              op.scale_offset =
                  (splace.base + (b.start[0] / kFp8Block - sbox.start[0]) * splace.stride[0] +
                   (b.start[1] / kFp8Block - sbox.start[1]) * splace.stride[1]) *
                  4;
            }
            if (it->holder_count == 1) {
              op.src_agent = holder.agent;
              op.src_tensor = holder.tensor;
              OpList& list = plan_.ops[holder.agent];
              std::vector<uint64_t>& slots = g->slot[holder.agent];
              const size_t key = OrderKey(holder.agent, dref.agent, info.phase);
              // CountShard counted these same loops: a mismatch is a planner bug, reported
              // instead of written past the sender's list.
              if (slots.empty() || slots[key] >= list.size()) {
                out->Add(absl::StrCat("internal: more ops than counted for ", Name(n)));
                break;
              }
              list[slots[key]++] = op;
            } else {
              g->pending.push_back(PendingChoice{op, static_cast<int32_t>(it - slices_.get())});
            }
          }
        }
        if (info.fp8_error_reported) break;
      }
      if (info.fp8_error_reported) break;
    }
  }
}

void Planner::CountShard(GenShard* g, size_t nkeys) {
  std::vector<Run> runs;
  Box sb, b;
  g->slot.assign(agents_.size(), {});
  for (size_t k = g->begin; k < g->end; ++k) {
    const int32_t n = dst_names_[k];
    const NameInfo& info = infos_[n];
    if (info.bad || info.derived_scale || info.parts.empty() || info.fp8_error_reported) continue;
    const bool fp8 = info.transform == weightbeam::v1::TRANSFORM_FP8_BLOCK;
    for (const DstClass& cls : info.classes) {
      const EntryRef dref = cls.leader;
      const Box dbox = EntryBox(E(dref));
      for (const Part& part : info.parts) {
        const NameInfo& src = infos_[part.src_name];
        const int64_t off0 = info.fusion_dim == 0 ? part.offset : 0;
        const Slice* first = slices_.get() + src.slice_begin;
        const Slice* last = first + src.slice_count;
        const Slice* it = std::upper_bound(first, last, dbox.start[0] - off0 - src.max_len0,
                                           [](int64_t v, const Slice& s) { return v < s.start0; });
        for (; it != last && it->start0 + off0 < dbox.End(0); ++it) {
          if (it->holder_count != 1 || it->start0 + off0 + it->size0 <= dbox.start[0]) continue;
          SliceBox(*it, info.fusion_dim, part.offset, &sb);
          if (!Intersect(dbox, sb, &b)) continue;
          uint64_t n_runs = 1;  // 1-D, 2-D and FP8 boxes are always a single op
          if (!fp8 && dbox.ndim > 2) {
            runs.clear();
            BoxRuns(b, SourcePlacement(E(holders_[it->holder_begin]), sb), EntryPlacement(E(dref)),
                    &runs);
            n_runs = runs.size();
          }
          const int32_t sender = holders_[it->holder_begin].agent;
          std::vector<uint64_t>& count = g->slot[sender];
          if (count.empty()) count.assign(nkeys, 0);
          count[OrderKey(sender, dref.agent, info.phase)] += n_runs;
        }
      }
    }
  }
}

void Planner::Generate() {
  CountPhases();
  const size_t na = agents_.size();
  const size_t nkeys = static_cast<size_t>(phases_) * na;
  // Destination names in contiguous shards of about equal work (entries x source slices),
  // one per thread. Each shard groups its names into destination classes and counts its
  // single-holder ops per sender and order key; the counts place every shard's ops at their
  // final positions (key by key, shard by shard), and the shards then generate straight into
  // the senders' lists. The plan does not depend on the thread count.
  const int threads = Threads();
  std::vector<uint64_t> work(dst_names_.size(), 1);
  for (size_t k = 0; k < dst_names_.size(); ++k) {
    const NameInfo& info = infos_[dst_names_[k]];
    uint64_t slices = 1;
    for (const Part& part : info.parts) slices += infos_[part.src_name].slice_count;
    work[k] = info.dst.size() * slices + 1;
  }
  std::vector<GenShard> shards;
  for (const auto& [begin, end] : SplitByWork(work, threads)) {
    shards.emplace_back();
    shards.back().index = static_cast<int32_t>(shards.size() - 1);
    shards.back().begin = begin;
    shards.back().end = end;
  }
  ParallelFor(shards.size(), threads, [&](uint64_t i) {
    GroupDestinations(&shards[i]);
    CountShard(&shards[i], nkeys);
  });
  // Fan-out groups numbered after the previous shards'.
  plan_.fanout_begin.assign(1, 0);
  plan_.fanout_dsts.clear();
  plan_.fanout_mirrored.clear();
  plan_.fanout_size.clear();
  std::vector<int32_t> fanout_offset;
  for (GenShard& g : shards) {
    fanout_offset.push_back(static_cast<int32_t>(plan_.fanout_begin.size() - 1));
    for (uint32_t size : g.fanout_sizes) {
      plan_.fanout_begin.push_back(plan_.fanout_begin.back() + size);
    }
    plan_.fanout_dsts.insert(plan_.fanout_dsts.end(), g.fanout_dsts.begin(), g.fanout_dsts.end());
    plan_.fanout_mirrored.insert(plan_.fanout_mirrored.end(), g.fanout_mirrored.begin(),
                                 g.fanout_mirrored.end());
    plan_.fanout_size.insert(plan_.fanout_size.end(), g.fanout_executed.begin(),
                             g.fanout_executed.end());
    std::vector<Destination>().swap(g.fanout_dsts);
  }
  for (GenShard& g : shards) {
    for (size_t k = g.begin; k < g.end; ++k) {
      for (DstClass& cls : infos_[dst_names_[k]].classes) {
        if (cls.fanout >= 0) cls.fanout += fanout_offset[g.index];
      }
    }
  }
  // Counts become first positions: per sender, key by key, shard by shard. The senders' lists
  // are sized on every thread: first touching a GB of ops is much of the plan's time.
  ParallelFor(na, threads, [&](uint64_t a) {
    const bool sends = std::any_of(shards.begin(), shards.end(),
                                   [&](const GenShard& g) { return !g.slot[a].empty(); });
    if (!sends) return;
    uint64_t total = 0;
    for (size_t k = 0; k < nkeys; ++k) {
      for (GenShard& g : shards) {
        if (g.slot[a].empty()) continue;
        const uint64_t count = g.slot[a][k];
        g.slot[a][k] = total;
        total += count;
      }
    }
    plan_.ops[a].resize(total);
  });
  ParallelFor(shards.size(), threads, [&](uint64_t i) { GenerateShard(&shards[i]); });
  // Problems as one pass would list them (grouping's for every name, then generation's) and
  // balancing choices in name order, whatever the thread count.
  for (GenShard& g : shards) problems_.Merge(g.problems);
  for (GenShard& g : shards) {
    problems_.Merge(g.generate_problems);
    pending_.insert(pending_.end(), g.pending.begin(), g.pending.end());
    std::vector<PendingChoice>().swap(g.pending);
  }
}

}  // namespace internal

}  // namespace wb::planner
