#include "common/tensor/tensor_checks.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tensor/dtype.h"

namespace wb::registry {

namespace v1 = weightbeam::v1;

// The table in dtype.h is keyed by these values.
static_assert(tensor::DTypeBytes(v1::DTYPE_F32) == 4 && tensor::DTypeBytes(v1::DTYPE_F16) == 2 &&
              tensor::DTypeBytes(v1::DTYPE_BF16) == 2 &&
              tensor::DTypeBytes(v1::DTYPE_F8_E4M3) == 1 &&
              tensor::DTypeBytes(v1::DTYPE_I32) == 4 && tensor::DTypeBytes(v1::DTYPE_I64) == 8 &&
              tensor::DTypeBytes(v1::DTYPE_U8) == 1 && v1::DType_MAX == v1::DTYPE_U8);

namespace {

// Products are checked against 2^62 so element and byte counts cannot overflow.
constexpr uint64_t kMaxVolume = uint64_t{1} << 62;

// Extent of the shard along its dimension d.
int64_t ShardExtent(const v1::TensorSpec& spec, int d) {
  return spec.shard_size() == 0 ? spec.global_shape(d) : spec.shard(d).size();
}

// Extent of a viewed shard along buffer dimension d (leading dimensions take one element).
int64_t ViewExtent(const v1::TensorSpec& spec, int d) {
  const int lead = spec.view().shape_size() - spec.global_shape_size();
  return d < lead ? 1 : ShardExtent(spec, d - lead);
}

absl::Status ValidateView(const v1::TensorSpec& spec, uint64_t esize, uint64_t length) {
  const v1::BufferView& v = spec.view();
  const std::string where = absl::StrCat("tensor '", spec.name(), "' (part of buffer '", v.buffer(),
                                         "' [", absl::StrJoin(v.shape(), ", "), "])");
  const int n = v.shape_size();
  if (n < 1 || n > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the buffer has ", n, " dimensions (1 to 8)"));
  }
  if (spec.global_shape_size() > n) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the shard has ",
                                                   spec.global_shape_size(),
                                                   " dimensions, more than the buffer's ", n));
  }
  if (v.offset_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the view has ", v.offset_size(),
                                                   " offsets for ", n, " buffer dimensions"));
  }
  uint64_t volume = 1;
  for (int d = 0; d < n; ++d) {
    const int64_t extent = v.shape(d);
    if (extent <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": buffer dimension ", d, " is ", extent, " (must be positive)"));
    }
    if (volume > kMaxVolume / static_cast<uint64_t>(extent)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the buffer is too large"));
    }
    volume *= static_cast<uint64_t>(extent);
    const int64_t off = v.offset(d), size = ViewExtent(spec, d);
    // size <= extent first, so extent - size cannot overflow and offset <= it is exact.
    if (off < 0 || size > extent || off > extent - size) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the shard spans [", off, ", ", off,
                                                     " + ", size, ") of buffer dimension ", d,
                                                     " whose extent is ", extent));
    }
  }
  if (volume > kMaxVolume / esize || volume * esize != length) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the buffer of ", tensor::DTypeName(spec.dtype()), " needs ",
        volume > kMaxVolume / esize ? std::string("too many") : absl::StrCat(volume * esize),
        " bytes but the memory handle covers ", length));
  }
  return absl::OkStatus();
}

}  // namespace

bool ViewPartsOverlap(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  const int n = a.view().shape_size();
  if (n != b.view().shape_size()) return true;  // not one buffer: treat as a conflict
  for (int d = 0; d < n; ++d) {
    const int64_t lo = std::max(a.view().offset(d), b.view().offset(d));
    const int64_t hi =
        std::min(a.view().offset(d) + ViewExtent(a, d), b.view().offset(d) + ViewExtent(b, d));
    if (hi <= lo) return false;
  }
  return true;
}

uint64_t ShardElements(const v1::TensorSpec& spec) {
  uint64_t n = 1;
  if (spec.shard_size() == 0) {
    for (int64_t d : spec.global_shape()) n *= static_cast<uint64_t>(d);
  } else {
    for (const auto& s : spec.shard()) n *= static_cast<uint64_t>(s.size());
  }
  return n;
}

absl::Status ValidateTensorSpec(const v1::TensorSpec& spec, uint64_t length) {
  const std::string where = absl::StrCat("tensor '", spec.name(), "'");
  if (spec.name().empty()) return absl::InvalidArgumentError("a tensor has an empty name");
  if (spec.name().size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("tensor name longer than 1024 characters: '",
                                                   spec.name().substr(0, 64), "...'"));
  }
  const uint32_t esize = tensor::DTypeBytes(spec.dtype());
  if (esize == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown dtype ", static_cast<int>(spec.dtype()),
                     " (expected f32, f16, bf16, f8_e4m3, i32, i64 or u8)"));
  }
  if (spec.global_shape_size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", spec.global_shape_size(), " dimensions (at most 8)"));
  }
  constexpr uint64_t kMax = kMaxVolume;
  uint64_t volume = 1;
  for (int d = 0; d < spec.global_shape_size(); ++d) {
    int64_t n = spec.global_shape(d);
    if (n <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": dimension ", d, " of the global shape is ", n, " (must be positive)"));
    }
    if (volume > kMax / static_cast<uint64_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": global shape [", absl::StrJoin(spec.global_shape(), ", "), "] is too large"));
    }
    volume *= static_cast<uint64_t>(n);
  }
  if (spec.shard_size() != 0 && spec.shard_size() != spec.global_shape_size()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": shard has ", spec.shard_size(),
                                                   " slices but the tensor has ",
                                                   spec.global_shape_size(), " dimensions"));
  }
  for (int d = 0; d < spec.shard_size(); ++d) {
    const auto& s = spec.shard(d);
    if (s.start() < 0 || s.size() <= 0 || s.start() > spec.global_shape(d) - s.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shard slice [", s.start(), ", ", s.start() + s.size(), ") of dimension ", d,
          " is outside the global extent ", spec.global_shape(d)));
    }
  }
  if (spec.has_view()) return ValidateView(spec, esize, length);
  // The shard's volume is at most the global volume (< 2^62); its byte count may still not
  // fit in 64 bits (an i64 tensor of 2^61 + 1 elements would wrap around to 8 bytes).
  const uint64_t elements = ShardElements(spec);
  if (elements > std::numeric_limits<uint64_t>::max() / esize) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": shape [", absl::StrJoin(spec.global_shape(), ", "), "] of ",
                     tensor::DTypeName(spec.dtype()), " needs more than 2^64 bytes"));
  }
  const uint64_t expected = elements * esize;
  if (expected != length) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": shape [", absl::StrJoin(spec.global_shape(), ", "), "]",
                     spec.shard_size() ? " (shard)" : "", " of ", tensor::DTypeName(spec.dtype()),
                     " needs ", expected, " bytes but the memory handle covers ", length));
  }
  return absl::OkStatus();
}

}  // namespace wb::registry
