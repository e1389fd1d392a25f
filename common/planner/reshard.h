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

// Where a held box lies in its buffer: the element offset of its first element and, per
// dimension of the tensor, the element stride and the buffer's extent along it. A dimension
// folds into a contiguous run only where a box spans that whole extent. A dense shard is its
// own buffer; a view part (layout.h BufferView) maps onto the buffer's last dimensions.
struct Placement {
  Box held;
  int64_t base = 0;
  int64_t stride[kMaxDims] = {};
  int64_t extent[kMaxDims] = {};
};

Placement DensePlacement(const Box& held);
// The entry's placement: its view inside the buffer, else dense at offset 0.
Placement EntryPlacement(const TensorEntry& entry);

// The runs copying `box` (global coordinates, inside both held boxes) from the `src` buffer to
// the `dst` buffer, appended to *out in row-major order. A box that is a 2-level strided
// pattern in both buffers gives one run; deeper patterns give one run per index of the outer
// dimensions.
void BoxRuns(const Box& box, const Placement& src, const Placement& dst, std::vector<Run>* out);
// The same between two dense shards.
void BoxRuns(const Box& box, const Box& src, const Box& dst, std::vector<Run>* out);

}  // namespace wb::planner
