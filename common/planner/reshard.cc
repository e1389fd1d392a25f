#include "common/planner/reshard.h"

#include <algorithm>

namespace wb::planner {

int64_t Box::Volume() const {
  int64_t v = 1;
  for (int d = 0; d < ndim; ++d) v *= size[d];
  return v;
}

bool Box::operator==(const Box& o) const {
  if (ndim != o.ndim) return false;
  for (int d = 0; d < ndim; ++d) {
    if (start[d] != o.start[d] || size[d] != o.size[d]) return false;
  }
  return true;
}

bool Box::operator<(const Box& o) const {
  if (ndim != o.ndim) return ndim < o.ndim;
  for (int d = 0; d < ndim; ++d) {
    if (start[d] != o.start[d]) return start[d] < o.start[d];
  }
  for (int d = 0; d < ndim; ++d) {
    if (size[d] != o.size[d]) return size[d] < o.size[d];
  }
  return false;
}

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

bool Intersect(const Box& a, const Box& b, Box* out) {
  out->ndim = a.ndim;
  for (int d = 0; d < a.ndim; ++d) {
    int64_t lo = std::max(a.start[d], b.start[d]);
    int64_t hi = std::min(a.End(d), b.End(d));
    if (hi <= lo) return false;
    out->start[d] = lo;
    out->size[d] = hi - lo;
  }
  return true;
}

void BoxRuns(const Box& box, const Box& src, const Box& dst, std::vector<Run>* out) {
  const int n = box.ndim;
  // Element strides of each dimension in both buffers.
  int64_t sstr[kMaxDims], dstr[kMaxDims];
  int64_t s = 1, t = 1;
  for (int d = n - 1; d >= 0; --d) {
    sstr[d] = s;
    dstr[d] = t;
    s *= src.size[d];
    t *= dst.size[d];
  }
  // Innermost contiguous run: dimensions below k are covered entirely in both buffers.
  int k = n - 1;
  int64_t run = box.size[k];
  while (k > 0 && box.size[k] == src.size[k] && box.size[k] == dst.size[k]) {
    --k;
    run *= box.size[k];
  }
  // Row level: dimensions [r, k) fold into one stride while the box spans them entirely.
  int64_t rows = 1;
  int r = k;
  if (k > 0) {
    r = k - 1;
    rows = box.size[r];
    while (r > 0 && box.size[r] == src.size[r] && box.size[r] == dst.size[r]) {
      --r;
      rows *= box.size[r];
    }
  }
  const int64_t row_sstride = k > 0 ? sstr[k - 1] : run;
  const int64_t row_dstride = k > 0 ? dstr[k - 1] : run;
  // Enumerate the remaining outer dimensions [0, r) row-major.
  int64_t idx[kMaxDims] = {};
  while (true) {
    int64_t so = 0, dof = 0;
    for (int d = 0; d < n; ++d) {
      int64_t g = box.start[d] + (d < r ? idx[d] : 0);
      so += (g - src.start[d]) * sstr[d];
      dof += (g - dst.start[d]) * dstr[d];
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
