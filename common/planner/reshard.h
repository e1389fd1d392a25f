// N-dimensional resharding geometry: boxes of a global tensor, their intersection, and the
// strided runs (rows x contiguous elements) that copy a box from one row-major shard buffer
// into another. Contiguous dimensions are coalesced, so a dim-0 slice is a single run.
#pragma once

#include <cstdint>
#include <vector>

#include "common/planner/layout.h"

namespace wb::planner {

struct Box {
  int ndim = 0;
  int64_t start[kMaxDims] = {};
  int64_t size[kMaxDims] = {};

  int64_t End(int d) const { return start[d] + size[d]; }
  int64_t Volume() const;
  bool operator==(const Box& o) const;
  bool operator<(const Box& o) const;  // lexicographic on starts, then sizes
};

// The box a tensor entry holds (the full tensor when its shard is empty).
Box EntryBox(const TensorEntry& entry);

// Writes a ∩ b to *out; false when empty.
bool Intersect(const Box& a, const Box& b, Box* out);

// Offsets and strides in elements of the respective buffer.
struct Run {
  uint64_t src_offset = 0;
  uint64_t src_stride = 0;
  uint64_t dst_offset = 0;
  uint64_t dst_stride = 0;
  uint64_t rows = 0;
  uint64_t row_elems = 0;
};

// The runs copying `box` (global coordinates, inside both `src` and `dst`) from the buffer
// holding `src` to the buffer holding `dst`, appended to *out in row-major order. A box that
// is a 2-level strided pattern in both buffers gives one run; deeper patterns give one run
// per index of the outer dimensions.
void BoxRuns(const Box& box, const Box& src, const Box& dst, std::vector<Run>* out);

}  // namespace wb::planner
