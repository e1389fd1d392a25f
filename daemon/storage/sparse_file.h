// The tensors in the store's safetensors files: each shard's box and encoding in the file metadata,
// dense shards, and sparse records whose indices are global element indices of the full tensor;
// reading them back and writing the part a destination shard holds.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/planner/name_rules.h"
#include "common/tensor/box.h"
#include "daemon/delta/delta_codec.h"
#include "daemon/storage/safetensors.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::storage {

using tensor::Box;

uint64_t Elements(const std::vector<int64_t> &size);

// Tensors in files are refused beyond this many elements (2^62), so that element counts, global
// indices and strides computed from file metadata never wrap (byte offsets are bounded by the
// file's real size and by the destination's registered length).
inline constexpr uint64_t kMaxStoredElements = uint64_t{1} << 62;
// The element count of `shape` from a file; nullopt when a dimension is negative or the count
// exceeds kMaxStoredElements.
std::optional<uint64_t> CheckedElements(const std::vector<int64_t> &shape);

// The part of the global tensor a buffer holds (registered specs have at most kMaxDims).
Box BoxOf(const weightbeam::v1::TensorSpec &spec);
std::vector<int64_t> Starts(const Box &b);
std::vector<int64_t> Sizes(const Box &b);
std::vector<int64_t> GlobalShape(const weightbeam::v1::TensorSpec &spec);

// Row-major strides (in elements) of a box of `size`.
std::vector<uint64_t> Strides(const std::vector<int64_t> &size);

// Copies the elements of `in` from a buffer holding `src_rect` to one holding `dst_rect`.
void CopyRect(const uint8_t *src, const Box &src_rect, uint8_t *dst, const Box &dst_rect,
              const Box &in, int elem);

// The safetensors dtype of indices `width` bytes wide.
const char *IndexDtype(int width);

// The codec's packed records (indices local to the shard buffer) as global indices of the full
// tensor, delta-coded in the narrowest width. Returns the width.
int GlobalGaps(absl::Span<const uint8_t> packed, const delta::DeltaHeader &h, const Box &shard,
               const std::vector<int64_t> &global_shape, std::vector<uint8_t> &out);

// One source shard of one tensor in a version, checked and ready to apply.
struct Source {
  std::string file;
  std::string dtype;
  std::vector<int64_t> global_shape;
  Box rect;
  absl::Span<const uint8_t> dense;   // dense encoding: the shard's bytes
  std::vector<uint64_t> indices;     // sparse encoding: global indices ...
  absl::Span<const uint8_t> values;  // ... and their values
  bool sparse = false;
};

// Reads the tensors of one file into `by_name`.
absl::Status CollectSources(const SafetensorsFile &f, uint64_t version,
                            std::map<std::string, std::vector<Source>> &by_name);

// Writes the records of a sparse source that fall inside the destination shard.
void ScatterInto(const Source &s, const Box &dst_rect, int elem, uint8_t *dst);

// When `name` is a fused tensor of one of `fusions` (the planner's rules, storage.fusions) and
// every part is in `sources`, adds the parts as sources of `name`: dense shards and sparse records
// moved along the fusion dimension by the sizes of the parts before them.
void AddFusedSources(const std::string &name, const std::vector<planner::FusionRule> &fusions,
                     std::map<std::string, std::vector<Source>> &sources);

}  // namespace wb::storage
