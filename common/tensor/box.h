// Boxes of a global tensor (the part a shard buffer holds, or the overlap of two shards) and
// their intersection: one definition for the planner's resharding and the storage path.
#pragma once

#include <cstdint>
#include <string>

namespace wb::tensor {

// The most dimensions a tensor may have.
inline constexpr int kMaxDims = 8;

// global[start, start + size) along each of `ndim` dimensions.
struct Box {
  int ndim = 0;
  int64_t start[kMaxDims] = {};
  int64_t size[kMaxDims] = {};

  int64_t End(int d) const { return start[d] + size[d]; }
  int64_t Volume() const;
  bool operator==(const Box& o) const;
  bool operator<(const Box& o) const;  // lexicographic on starts, then sizes
};

// Writes a ∩ b to *out; false when empty.
bool Intersect(const Box& a, const Box& b, Box* out);

// "[0:128, 0:1024]" (start:end per dimension).
std::string FormatBox(const Box& box);

}  // namespace wb::tensor
