#include "common/planner/reshard.h"

#include <algorithm>

namespace wb::planner {

Box EntryBox(const TensorEntry& entry) {
  Box b;
  b.ndim = static_cast<int>(std::min<size_t>(entry.shape.size(), kMaxDims));
  for (int d = 0; d < b.ndim; ++d) {
    if (entry.shard.empty()) {
      b.start[d] = 0;
      b.size[d] = entry.shape[d];
    } else {
      b.start[d] = entry.shard[d].start;
      b.size[d] = entry.shard[d].size;
    }
  }
  return b;
}

Placement DensePlacement(const Box& held) {
  Placement p;
  p.held = held;
  int64_t s = 1;
  for (int d = held.ndim - 1; d >= 0; --d) {
    p.stride[d] = s;
    p.extent[d] = held.size[d];
    s *= held.size[d];
  }
  return p;
}

Placement EntryPlacement(const TensorEntry& entry) {
  const Box held = EntryBox(entry);
  if (entry.view.empty()) return DensePlacement(held);
  Placement p;
  p.held = held;
  const int n = static_cast<int>(entry.view.shape.size());
  const int lead = n - held.ndim;
  int64_t s = 1;
  for (int d = n - 1; d >= 0; --d) {
    p.base += entry.view.offset[d] * s;
    if (d >= lead) {
      p.stride[d - lead] = s;
      p.extent[d - lead] = entry.view.shape[d];
    }
    s *= entry.view.shape[d];
  }
  return p;
}

void BoxRuns(const Box& box, const Box& src, const Box& dst, std::vector<Run>* out) {
  BoxRuns(box, DensePlacement(src), DensePlacement(dst), out);
}

void BoxRuns(const Box& box, const Placement& src, const Placement& dst, std::vector<Run>* out) {
  const int n = box.ndim;
  const int64_t* sstr = src.stride;
  const int64_t* dstr = dst.stride;
  auto whole = [&](int d) { return box.size[d] == src.extent[d] && box.size[d] == dst.extent[d]; };
  // Innermost contiguous run: dimensions below k span both buffers' whole extents.
  int k = n - 1;
  int64_t run = box.size[k];
  while (k > 0 && whole(k)) {
    --k;
    run *= box.size[k];
  }
  // Row level: dimensions [r, k) fold into one stride while the box spans them entirely.
  int64_t rows = 1;
  int r = k;
  if (k > 0) {
    r = k - 1;
    rows = box.size[r];
    while (r > 0 && whole(r)) {
      --r;
      rows *= box.size[r];
    }
  }
  const int64_t row_sstride = k > 0 ? sstr[k - 1] : run;
  const int64_t row_dstride = k > 0 ? dstr[k - 1] : run;
  // Enumerate the remaining outer dimensions [0, r) row-major.
  int64_t idx[kMaxDims] = {};
  while (true) {
    int64_t so = src.base, dof = dst.base;
    for (int d = 0; d < n; ++d) {
      int64_t g = box.start[d] + (d < r ? idx[d] : 0);
      so += (g - src.held.start[d]) * sstr[d];
      dof += (g - dst.held.start[d]) * dstr[d];
    }
    Run op;
    op.src_offset = so;
    op.dst_offset = dof;
    op.rows = rows;
    op.row_elems = run;
    op.src_stride = rows > 1 ? row_sstride : run;
    op.dst_stride = rows > 1 ? row_dstride : run;
    out->push_back(op);
    int d = r - 1;
    while (d >= 0) {
      if (++idx[d] < box.size[d]) break;
      idx[d] = 0;
      --d;
    }
    if (d < 0) break;
  }
}

}  // namespace wb::planner
