#include "common/tensor/tensor_checks.h"

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
  // Products are checked against 2^62 so element and byte counts cannot overflow.
  constexpr uint64_t kMax = uint64_t{1} << 62;
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
  const uint64_t expected = ShardElements(spec) * esize;
  if (expected != length) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": shape [", absl::StrJoin(spec.global_shape(), ", "), "]",
                     spec.shard_size() ? " (shard)" : "", " of ", tensor::DTypeName(spec.dtype()),
                     " needs ", expected, " bytes but the memory handle covers ", length));
  }
  return absl::OkStatus();
}

}  // namespace wb::registry
