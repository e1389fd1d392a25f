// N-dimensional resharding geometry: boxes of a global tensor, their intersection, and the
// strided runs (rows x contiguous elements) that copy a box from one row-major shard buffer
// into another. Contiguous dimensions are coalesced, so a dim-0 slice is a single run.
#pragma once

#include <cstdint>
#include <vector>

#include "common/planner/layout.h"
#include "common/tensor/box.h"

namespace wb::planner {

// Boxes and their intersection: common/tensor/box.h.
using tensor::Box;
using tensor::Intersect;

// The box a tensor entry holds (the full tensor when its shard is empty).
Box EntryBox(const TensorEntry& entry);

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
