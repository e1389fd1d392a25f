#include "common/tensor/box.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace wb::tensor {

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

std::string FormatBox(const Box& box) {
  std::string out = "[";
  for (int d = 0; d < box.ndim; ++d)
    absl::StrAppend(&out, d ? ", " : "", box.start[d], ":", box.End(d));
  return out + "]";
}

}  // namespace wb::tensor
