// Indices in files are global element indices of the full tensor (row-major), delta-coded (index[i]
// - index[i-1]; the first is absolute) in the narrowest unsigned integer that holds every gap, so
// any destination sharding can pick the records it holds.
#include "daemon/storage/sparse_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "daemon/storage/delta_store.h"

namespace wb::storage {

namespace v1 = weightbeam::v1;
using json = nlohmann::json;

namespace {

template <typename T>
void PutGaps(const std::vector<uint64_t> &indices, std::vector<uint8_t> &out) {
  out.resize(indices.size() * sizeof(T));
  uint64_t prev = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    const T gap = static_cast<T>(indices[i] - prev);
    std::memcpy(out.data() + i * sizeof(T), &gap, sizeof(T));
    prev = indices[i];
  }
}

absl::StatusOr<std::vector<uint64_t>> DecodeIndices(const SafetensorsFile &f,
                                                    const std::string &name, const TensorEntry &e,
                                                    uint64_t total) {
  const int width = DtypeBytes(e.dtype);
  if (e.shape.size() != 1 ||
      (e.dtype != "U8" && e.dtype != "U16" && e.dtype != "U32" && e.dtype != "U64")) {
    return absl::DataLossError(
        absl::StrCat(f.source(), ": tensor '", name, "' must be a 1-D U8/U16/U32/U64 array"));
  }
  auto data = f.Data(e);
  std::vector<uint64_t> out(e.elements());
  uint64_t idx = 0;
  for (uint64_t i = 0; i < out.size(); ++i) {
    uint64_t gap = 0;
    std::memcpy(&gap, data.data() + i * width, width);
    const uint64_t base = i == 0 ? 0 : idx;  // base < total here, so no wrap below
    if ((i > 0 && gap == 0) || gap >= total - base) {
      return absl::DataLossError(absl::StrCat(f.source(), ": tensor '", name, "': record ", i,
                                              " (gap ", gap, ") is not an increasing index below ",
                                              total));
    }
    idx = base + gap;
    out[i] = idx;
  }
  return out;
}

}  // namespace

uint64_t Elements(const std::vector<int64_t> &size) {
  uint64_t n = 1;
  for (int64_t d : size) n *= static_cast<uint64_t>(d);
  return n;
}

std::optional<uint64_t> CheckedElements(const std::vector<int64_t> &shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > kMaxStoredElements / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

Box BoxOf(const v1::TensorSpec &spec) {
  Box b;
  b.ndim = std::min(spec.global_shape_size(), tensor::kMaxDims);
  const bool sharded = spec.shard_size() == spec.global_shape_size();
  for (int d = 0; d < b.ndim; ++d) {
    b.start[d] = sharded ? spec.shard(d).start() : 0;
    b.size[d] = sharded ? spec.shard(d).size() : spec.global_shape(d);
  }
  return b;
}

std::vector<int64_t> Starts(const Box &b) { return {b.start, b.start + b.ndim}; }
std::vector<int64_t> Sizes(const Box &b) { return {b.size, b.size + b.ndim}; }

std::vector<int64_t> GlobalShape(const v1::TensorSpec &spec) {
  return {spec.global_shape().begin(), spec.global_shape().end()};
}

std::vector<uint64_t> Strides(const std::vector<int64_t> &size) {
  std::vector<uint64_t> s(size.size(), 1);
  for (int d = static_cast<int>(size.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * size[d + 1];
  return s;
}

void CopyRect(const uint8_t *src, const Box &src_rect, uint8_t *dst, const Box &dst_rect,
              const Box &in, int elem) {
  const size_t n = in.ndim;
  if (n == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  const auto ss = Strides(Sizes(src_rect)), ds = Strides(Sizes(dst_rect));
  const size_t run = static_cast<size_t>(in.size[n - 1]) * elem;
  std::vector<int64_t> c(n, 0);  // position within `in`, last dimension unused
  while (true) {
    uint64_t so = 0, dof = 0;
    for (size_t d = 0; d < n; ++d) {
      so += (in.start[d] + c[d] - src_rect.start[d]) * ss[d];
      dof += (in.start[d] + c[d] - dst_rect.start[d]) * ds[d];
    }
    std::memcpy(dst + dof * elem, src + so * elem, run);
    int d = static_cast<int>(n) - 2;
    for (; d >= 0; --d) {
      if (++c[d] < in.size[d]) break;
      c[d] = 0;
    }
    if (d < 0) return;
  }
}

const char *IndexDtype(int width) {
  switch (width) {
    case 1:
      return "U8";
    case 2:
      return "U16";
    case 4:
      return "U32";
    default:
      return "U64";
  }
}

int GlobalGaps(absl::Span<const uint8_t> packed, const delta::DeltaHeader &h, const Box &shard,
               const std::vector<int64_t> &global_shape, std::vector<uint8_t> &out) {
  const auto local_strides = Strides(Sizes(shard));
  const auto global_strides = Strides(global_shape);
  const uint8_t *gaps = packed.data() + delta::kDeltaHeaderBytes;
  std::vector<uint64_t> global(h.count);
  uint64_t local = 0, max_gap = 0, prev = 0;
  for (uint64_t i = 0; i < h.count; ++i) {
    uint64_t gap = 0;
    std::memcpy(&gap, gaps + i * h.index_width, h.index_width);  // little-endian
    local += gap;
    uint64_t g = 0, rest = local;
    for (int d = 0; d < shard.ndim; ++d) {
      const uint64_t c = rest / local_strides[d];
      rest %= local_strides[d];
      g += (c + shard.start[d]) * global_strides[d];
    }
    global[i] = g;
    max_gap = std::max(max_gap, g - prev);
    prev = g;
  }
  const int width = delta::DeltaIndexWidth(max_gap);
  switch (width) {
    case 1:
      PutGaps<uint8_t>(global, out);
      break;
    case 2:
      PutGaps<uint16_t>(global, out);
      break;
    case 4:
      PutGaps<uint32_t>(global, out);
      break;
    default:
      PutGaps<uint64_t>(global, out);
      break;
  }
  return width;
}

absl::Status CollectSources(const SafetensorsFile &f, uint64_t version,
                            std::map<std::string, std::vector<Source>> &by_name) {
  const auto &meta = f.metadata();
  auto get = [&](const std::string &k) {
    auto it = meta.find(k);
    return it == meta.end() ? std::string() : it->second;
  };
  if (get("format") != kStoreFormat || get("version") != absl::StrCat(version)) {
    return absl::DataLossError(absl::StrCat(f.source(), ": metadata says format '", get("format"),
                                            "' version '", get("version"), "', expected ",
                                            kStoreFormat, " version ", version));
  }
  for (const auto &[key, value] : meta) {
    if (key.rfind("shard:", 0) != 0) continue;
    const std::string name = key.substr(6);
    Source s;
    s.file = f.source();
    std::vector<int64_t> start, size;
    json j = json::parse(value, nullptr, false);
    try {
      s.dtype = j.at("dtype").get<std::string>();
      s.global_shape = j.at("global_shape").get<std::vector<int64_t>>();
      start = j.at("start").get<std::vector<int64_t>>();
      size = j.at("size").get<std::vector<int64_t>>();
      s.sparse = j.at("encoding").get<std::string>() == "sparse";
    } catch (const json::exception &e) {
      return absl::DataLossError(
          absl::StrCat(f.source(), ": metadata of tensor '", name, "' is malformed: ", e.what()));
    }
    const int elem = DtypeBytes(s.dtype);
    bool shape_ok = elem > 0 && s.global_shape.size() <= tensor::kMaxDims &&
                    start.size() == s.global_shape.size() && size.size() == s.global_shape.size() &&
                    CheckedElements(s.global_shape).has_value();
    for (size_t d = 0; shape_ok && d < s.global_shape.size(); ++d) {
      // size <= global - start, not start + size <= global: the sum of two values from the file
      // could wrap.
      shape_ok = s.global_shape[d] >= 0 && start[d] >= 0 && size[d] >= 0 &&
                 start[d] <= s.global_shape[d] && size[d] <= s.global_shape[d] - start[d];
      s.rect.start[d] = start[d];
      s.rect.size[d] = size[d];
    }
    s.rect.ndim = static_cast<int>(s.global_shape.size());
    if (!shape_ok) {
      return absl::DataLossError(absl::StrCat(f.source(), ": tensor '", name,
                                              "': shard metadata is inconsistent: ", value));
    }
    if (!s.sparse) {
      const TensorEntry *e = f.Find(name);
      if (e == nullptr || e->dtype != s.dtype ||
          e->elements() != static_cast<uint64_t>(s.rect.Volume())) {
        return absl::DataLossError(absl::StrCat(f.source(), ": tensor '", name,
                                                "' is missing or does not match its shard ",
                                                tensor::FormatBox(s.rect)));
      }
      s.dense = f.Data(*e);
    } else {
      const TensorEntry *ind = f.Find(name + ".indices");
      const TensorEntry *val = f.Find(name + ".values");
      if (ind == nullptr || val == nullptr) {
        return absl::DataLossError(absl::StrCat(f.source(), ": tensor '", name, "': '", name,
                                                ".indices' or '", name, ".values' is missing"));
      }
      auto indices = DecodeIndices(f, name + ".indices", *ind, Elements(s.global_shape));
      if (!indices.ok()) return indices.status();
      if (val->dtype != s.dtype || val->elements() != indices->size()) {
        return absl::DataLossError(absl::StrCat(f.source(), ": tensor '", name, ".values' holds ",
                                                val->elements(), " ", val->dtype, " values for ",
                                                indices->size(), " indices of ", s.dtype));
      }
      s.indices = std::move(*indices);
      s.values = f.Data(*val);
    }
    by_name[name].push_back(std::move(s));
  }
  return absl::OkStatus();
}

void ScatterInto(const Source &s, const Box &dst_rect, int elem, uint8_t *dst) {
  const auto gs = Strides(s.global_shape);
  const auto ls = Strides(Sizes(dst_rect));
  const size_t n = gs.size();
  for (size_t i = 0; i < s.indices.size(); ++i) {
    uint64_t rest = s.indices[i], local = 0;
    bool inside = true;
    for (size_t d = 0; d < n; ++d) {
      const int64_t c = static_cast<int64_t>(rest / gs[d]);
      rest %= gs[d];
      if (c < dst_rect.start[d] || c >= dst_rect.start[d] + dst_rect.size[d]) {
        inside = false;
        break;
      }
      local += (c - dst_rect.start[d]) * ls[d];
    }
    if (inside) std::memcpy(dst + local * elem, s.values.data() + i * elem, elem);
  }
}

void AddFusedSources(const std::string &name, const std::vector<planner::FusionRule> &fusions,
                     std::map<std::string, std::vector<Source>> &sources) {
  for (const auto &rule : fusions) {
    const auto part_names = planner::FusionPartNames(name, rule);
    if (!part_names) continue;
    std::vector<const std::vector<Source> *> parts;
    for (const auto &p : *part_names) {
      auto it = sources.find(p);
      if (it == sources.end() || it->second.empty()) return;
      parts.push_back(&it->second);
    }
    const size_t dim = static_cast<size_t>(rule.dim);
    std::vector<int64_t> fused = parts[0]->front().global_shape;
    if (dim >= fused.size()) return;
    fused[dim] = 0;
    for (const auto *part : parts) {
      std::vector<int64_t> shape = part->front().global_shape;
      if (shape.size() != fused.size()) return;
      for (size_t k = 0; k < shape.size(); ++k) {
        if (k != dim && shape[k] != fused[k]) return;  // parts that do not stack
      }
      // Every part's shape was checked (CheckedElements), but their sum along `dim` may not be.
      if (shape[dim] > std::numeric_limits<int64_t>::max() - fused[dim]) return;
      fused[dim] += shape[dim];
    }
    if (!CheckedElements(fused)) return;
    std::vector<Source> out;
    int64_t offset = 0;
    const auto fused_strides = Strides(fused);
    for (const auto *part : parts) {
      const int64_t size = part->front().global_shape[dim];
      for (const Source &src : *part) {
        Source s = src;
        s.global_shape = fused;
        s.rect.start[dim] += offset;
        if (s.sparse) {
          const auto part_strides = Strides(src.global_shape);
          for (uint64_t &idx : s.indices) {
            uint64_t rest = idx, moved = 0;
            for (size_t k = 0; k < part_strides.size(); ++k) {
              const uint64_t c = rest / part_strides[k];
              rest %= part_strides[k];
              moved += (c + (k == dim ? offset : 0)) * fused_strides[k];
            }
            idx = moved;
          }
        }
        out.push_back(std::move(s));
      }
      offset += size;
    }
    sources[name] = std::move(out);
    return;
  }
}

}  // namespace wb::storage
