// Publisher and subscriber of the storage path. Indices in files are global element indices of
// the full tensor (row-major), delta-coded (index[i] - index[i-1]; the first is absolute) in the
// narrowest unsigned integer that holds every gap, so any destination sharding can pick the
// records it holds.
#include "daemon/storage/delta_store.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/planner/name_rules.h"
#include "common/tensor/box.h"
#include "common/tensor/dtype.h"
#include "daemon/delta/delta_codec.h"
#include "daemon/storage/safetensors.h"
#include "daemon/transform/transform.h"

namespace wb::storage {

namespace v1 = weightbeam::v1;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using tensor::Box;

uint64_t Elements(const std::vector<int64_t>& size) {
  uint64_t n = 1;
  for (int64_t d : size) n *= static_cast<uint64_t>(d);
  return n;
}

// The part of the global tensor a buffer holds (registered specs have at most kMaxDims).
Box BoxOf(const v1::TensorSpec& spec) {
  Box b;
  b.ndim = std::min(spec.global_shape_size(), tensor::kMaxDims);
  const bool sharded = spec.shard_size() == spec.global_shape_size();
  for (int d = 0; d < b.ndim; ++d) {
    b.start[d] = sharded ? spec.shard(d).start() : 0;
    b.size[d] = sharded ? spec.shard(d).size() : spec.global_shape(d);
  }
  return b;
}

std::vector<int64_t> Starts(const Box& b) { return {b.start, b.start + b.ndim}; }
std::vector<int64_t> Sizes(const Box& b) { return {b.size, b.size + b.ndim}; }

std::vector<int64_t> GlobalShape(const v1::TensorSpec& spec) {
  return {spec.global_shape().begin(), spec.global_shape().end()};
}

// Row-major strides (in elements) of a box of `size`.
std::vector<uint64_t> Strides(const std::vector<int64_t>& size) {
  std::vector<uint64_t> s(size.size(), 1);
  for (int d = static_cast<int>(size.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * size[d + 1];
  return s;
}

// Copies the elements of `in` from a buffer holding `src_rect` to one holding `dst_rect`.
void CopyRect(const uint8_t* src, const Box& src_rect, uint8_t* dst, const Box& dst_rect,
              const Box& in, int elem) {
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

const char* IndexDtype(int width) {
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

template <typename T>
void PutGaps(const std::vector<uint64_t>& indices, std::vector<uint8_t>& out) {
  out.resize(indices.size() * sizeof(T));
  uint64_t prev = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    const T gap = static_cast<T>(indices[i] - prev);
    std::memcpy(out.data() + i * sizeof(T), &gap, sizeof(T));
    prev = indices[i];
  }
}

// The codec's packed records (indices local to the shard buffer) as global indices of the
// full tensor, delta-coded in the narrowest width. Returns the width.
int GlobalGaps(absl::Span<const uint8_t> packed, const delta::DeltaHeader& h, const Box& shard,
               const std::vector<int64_t>& global_shape, std::vector<uint8_t>& out) {
  const auto local_strides = Strides(Sizes(shard));
  const auto global_strides = Strides(global_shape);
  const uint8_t* gaps = packed.data() + delta::kDeltaHeaderBytes;
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
  const int width = delta::GapWidth(max_gap);
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

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

// Parses "<20 digits>.<rest>"; false for names of other shapes.
bool SplitVersion(const std::string& name, uint64_t* version, std::string* rest) {
  if (name.size() < 22 || name[20] != '.') return false;
  uint64_t v = 0;
  for (int i = 0; i < 20; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  *version = v;
  *rest = name.substr(21);
  return true;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One writer's manifest of one version.
struct FileRef {
  std::string name;
  uint64_t bytes = 0;
  std::string checksum;
};
struct Manifest {
  std::string writer;
  uint64_t version = 0;
  uint64_t base_version = 0;
  bool anchor = false;
  std::vector<FileRef> files;
  std::string error;  // why it cannot be used
};

Manifest ReadManifest(const std::string& path, uint64_t version, const std::string& writer) {
  Manifest m;
  m.writer = writer;
  m.version = version;
  auto bytes = ReadWholeFile(path);
  if (!bytes.ok()) {
    m.error = std::string(bytes.status().message());
    return m;
  }
  json j = json::parse(bytes->begin(), bytes->end(), nullptr, false);
  auto bad = [&](const std::string& what) {
    m.error = absl::StrCat(path, ": bad manifest: ", what);
    return m;
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  try {
    if (j.value("format", "") != kStoreFormat) {
      return bad(absl::StrCat("format is not ", kStoreFormat));
    }
    if (j.at("version").get<uint64_t>() != version) return bad("version differs from its name");
    m.base_version = j.at("base_version").get<uint64_t>();
    m.anchor = j.at("kind").get<std::string>() == "anchor";
    for (const auto& f : j.at("files")) {
      FileRef ref{f.at("name").get<std::string>(), f.at("bytes").get<uint64_t>(),
                  f.at("checksum").get<std::string>()};
      if (ref.name.find('/') != std::string::npos) return bad("a file name contains '/'");
      m.files.push_back(std::move(ref));
    }
  } catch (const json::exception& e) {
    return bad(e.what());
  }
  return m;
}

using VersionMap = std::map<uint64_t, std::map<std::string, Manifest>>;

absl::StatusOr<VersionMap> ListVersions(const std::string& dir) {
  VersionMap out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return absl::InternalError(absl::StrCat("listing ", dir, ": ", ec.message()));
    const std::string name = it->path().filename().string();
    uint64_t version = 0;
    std::string rest;
    if (!EndsWith(name, ".json") || !SplitVersion(name, &version, &rest)) continue;
    const std::string writer = rest.substr(0, rest.size() - 5);
    out[version][writer] = ReadManifest(it->path().string(), version, writer);
  }
  return out;
}

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

absl::StatusOr<std::vector<uint64_t>> DecodeIndices(const SafetensorsFile& f,
                                                    const std::string& name, const TensorEntry& e,
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

// Reads the tensors of one file into `by_name`.
absl::Status CollectSources(const SafetensorsFile& f, uint64_t version,
                            std::map<std::string, std::vector<Source>>& by_name) {
  const auto& meta = f.metadata();
  auto get = [&](const std::string& k) {
    auto it = meta.find(k);
    return it == meta.end() ? std::string() : it->second;
  };
  if (get("format") != kStoreFormat || get("version") != absl::StrCat(version)) {
    return absl::DataLossError(absl::StrCat(f.source(), ": metadata says format '", get("format"),
                                            "' version '", get("version"), "', expected ",
                                            kStoreFormat, " version ", version));
  }
  for (const auto& [key, value] : meta) {
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
    } catch (const json::exception& e) {
      return absl::DataLossError(
          absl::StrCat(f.source(), ": metadata of tensor '", name, "' is malformed: ", e.what()));
    }
    const int elem = DtypeBytes(s.dtype);
    bool shape_ok = elem > 0 && s.global_shape.size() <= tensor::kMaxDims &&
                    start.size() == s.global_shape.size() && size.size() == s.global_shape.size();
    for (size_t d = 0; shape_ok && d < s.global_shape.size(); ++d) {
      shape_ok = s.global_shape[d] >= 0 && start[d] >= 0 && size[d] >= 0 &&
                 start[d] + size[d] <= s.global_shape[d];
      s.rect.start[d] = start[d];
      s.rect.size[d] = size[d];
    }
    s.rect.ndim = static_cast<int>(s.global_shape.size());
    if (!shape_ok) {
      return absl::DataLossError(absl::StrCat(f.source(), ": tensor '", name,
                                              "': shard metadata is inconsistent: ", value));
    }
    if (!s.sparse) {
      const TensorEntry* e = f.Find(name);
      if (e == nullptr || e->dtype != s.dtype ||
          e->elements() != static_cast<uint64_t>(s.rect.Volume())) {
        return absl::DataLossError(absl::StrCat(f.source(), ": tensor '", name,
                                                "' is missing or does not match its shard ",
                                                tensor::FormatBox(s.rect)));
      }
      s.dense = f.Data(*e);
    } else {
      const TensorEntry* ind = f.Find(name + ".indices");
      const TensorEntry* val = f.Find(name + ".values");
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

// Writes the records of a sparse source that fall inside the destination shard.
void ScatterInto(const Source& s, const Box& dst_rect, int elem, uint8_t* dst) {
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

// When `name` is a fused tensor of one of `fusions` (the planner's rules, storage.fusions) and
// every part is in `sources`, adds the parts as sources of `name`: dense shards and sparse
// records moved along the fusion dimension by the sizes of the parts before them.
void AddFusedSources(const std::string& name, const std::vector<planner::FusionRule>& fusions,
                     std::map<std::string, std::vector<Source>>& sources) {
  for (const auto& rule : fusions) {
    const auto part_names = planner::FusionPartNames(name, rule);
    if (!part_names) continue;
    std::vector<const std::vector<Source>*> parts;
    for (const auto& p : *part_names) {
      auto it = sources.find(p);
      if (it == sources.end() || it->second.empty()) return;
      parts.push_back(&it->second);
    }
    const size_t dim = static_cast<size_t>(rule.dim);
    std::vector<int64_t> fused = parts[0]->front().global_shape;
    if (dim >= fused.size()) return;
    fused[dim] = 0;
    for (const auto* part : parts) {
      std::vector<int64_t> shape = part->front().global_shape;
      if (shape.size() != fused.size()) return;
      for (size_t k = 0; k < shape.size(); ++k) {
        if (k != dim && shape[k] != fused[k]) return;  // parts that do not stack
      }
      fused[dim] += shape[dim];
    }
    std::vector<Source> out;
    int64_t offset = 0;
    const auto fused_strides = Strides(fused);
    for (const auto* part : parts) {
      const int64_t size = part->front().global_shape[dim];
      for (const Source& src : *part) {
        Source s = src;
        s.global_shape = fused;
        s.rect.start[dim] += offset;
        if (s.sparse) {
          const auto part_strides = Strides(src.global_shape);
          for (uint64_t& idx : s.indices) {
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

// Where an FP8 destination's quantised bytes and block scales go.
struct Fp8Target {
  const ShardBuffer* scale = nullptr;
  transform::TransformDesc desc;
  float* scales = nullptr;  // the first scale of this shard's blocks
};

// Checks an FP8 e4m3 destination (2-D, BF16 in the files, shard on 128-element block
// boundaries) and finds its `<name>_scale_inv` F32 destination (same owner) covering its
// blocks. Without a BF16 copy yet, only dense sources (an anchor) can start one.
absl::StatusOr<Fp8Target> PlanFp8(const ShardBuffer& d, const std::vector<ShardBuffer>& all,
                                  const std::map<std::string, std::vector<Source>>& sources,
                                  bool has_copy) {
  constexpr int64_t kBlock = transform::kFp8BlockSize;
  const std::string where =
      absl::StrCat("FP8 destination tensor '", d.spec.name(), "' (rank ", d.rank, ")");
  const Box rect = BoxOf(d.spec);
  if (rect.ndim != 2 || rect.start[0] % kBlock != 0 || rect.start[1] % kBlock != 0) {
    return absl::UnimplementedError(absl::StrCat(
        where, ": the storage path quantises 2-D shards that start on 128-element blocks, not ",
        tensor::FormatBox(rect)));
  }
  const std::string scale_name = planner::ScaleTensorName(d.spec.name());
  Fp8Target t;
  for (const auto& c : all) {
    if (c.spec.name() == scale_name && c.rank == d.rank && c.replica == d.replica) t.scale = &c;
  }
  if (t.scale == nullptr || t.scale->spec.dtype() != v1::DTYPE_F32) {
    return absl::NotFoundError(
        absl::StrCat(where, " has no F32 scale tensor '", scale_name, "' registered by its owner"));
  }
  const Box srect = BoxOf(t.scale->spec);
  const int64_t b0 = rect.start[0] / kBlock, b1 = rect.start[1] / kBlock;
  const int64_t n0 = (rect.size[0] + kBlock - 1) / kBlock,
                n1 = (rect.size[1] + kBlock - 1) / kBlock;
  if (srect.ndim != 2 || b0 < srect.start[0] || b1 < srect.start[1] ||
      b0 + n0 > srect.start[0] + srect.size[0] || b1 + n1 > srect.start[1] + srect.size[1]) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": scale tensor '", scale_name,
                                                   "' shard ", tensor::FormatBox(srect),
                                                   " does not hold its blocks"));
  }
  if (!has_copy) {
    auto it = sources.find(d.spec.name());
    if (it != sources.end()) {
      for (const Source& s : it->second) {
        Box in;
        if (s.sparse && tensor::Intersect(s.rect, rect, &in)) {
          return absl::FailedPreconditionError(
              absl::StrCat(where, " has no BF16 copy to apply a delta to; waiting for an anchor"));
        }
      }
    }
  }
  t.desc.kind = transform::Kind::kFp8Block;
  t.desc.src_dtype = transform::DType::kBF16;
  t.desc.dst_dtype = transform::DType::kF8E4M3;
  t.desc.rows = rect.size[0];
  t.desc.cols = rect.size[1];
  t.desc.scale_stride = srect.size[1] * 4;
  if (auto s = transform::ValidateDesc(t.desc); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  t.scales = reinterpret_cast<float*>(t.scale->data.data()) +
             (b0 - srect.start[0]) * srect.size[1] + (b1 - srect.start[1]);
  return t;
}

}  // namespace

std::string VersionPrefix(uint64_t version) { return absl::StrFormat("%020u", version); }

std::string ManifestName(uint64_t version, const std::string& writer) {
  return absl::StrCat(VersionPrefix(version), ".", writer, ".json");
}

DeltaPublisher::DeltaPublisher(StoreOptions options) : options_(std::move(options)) {}

absl::Status DeltaPublisher::Resume() {
  auto versions = ListVersions(options_.dir);
  if (!versions.ok()) return versions.status();
  for (const auto& [v, manifests] : *versions) {
    if (manifests.count(options_.writer)) last_version_ = std::max(last_version_, v);
  }
  return absl::OkStatus();
}

absl::StatusOr<PublishResult> DeltaPublisher::Publish(uint64_t version,
                                                      const std::vector<ShardBuffer>& sources) {
  if (version == 0 || version <= last_version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " is not newer than the last published version ", last_version_));
  }
  // One file per trainer rank; a shard held twice (replicas) is written once.
  std::map<int, std::vector<const ShardBuffer*>> by_rank;
  std::set<std::string> seen;
  std::string set_key;
  for (const auto& s : sources) {
    const std::string dtype = tensor::SafetensorsDTypeName(s.spec.dtype());
    const Box rect = BoxOf(s.spec);
    if (dtype.empty() || rect.Volume() * DtypeBytes(dtype) != static_cast<int64_t>(s.data.size())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", s.spec.name(), "' (rank ", s.rank,
                                                     "): dtype or size cannot be published"));
    }
    if (!seen.insert(s.spec.name() + tensor::FormatBox(rect)).second) continue;
    by_rank[s.rank].push_back(&s);
    absl::StrAppend(&set_key, s.id, "/", s.spec.name(), tensor::FormatBox(rect), ";");
  }
  if (by_rank.empty()) {
    return absl::FailedPreconditionError(
        "nothing to publish: no trainer tensors are registered with this agent");
  }
  const bool anchor = force_anchor_ || last_anchor_ == 0 || set_key != source_set_ ||
                      version - last_anchor_ >= static_cast<uint64_t>(options_.anchor_every);
  if (anchor) shadows_.clear();
  force_anchor_ = true;  // until this version is written completely

  PublishResult result;
  result.version = version;
  result.anchor = anchor;
  result.base_version = anchor ? 0 : last_version_;
  json manifest = {{"format", kStoreFormat},
                   {"version", version},
                   {"base_version", result.base_version},
                   {"kind", anchor ? "anchor" : "delta"},
                   {"writer", options_.writer},
                   {"files", json::array()}};
  auto remove_written = [&] {
    for (const auto& f : result.files) ::unlink((options_.dir + "/" + f).c_str());
  };
  for (const auto& [rank, shards] : by_rank) {
    std::deque<std::vector<uint8_t>> owned;  // index buffers and packed deltas, kept alive
    std::vector<TensorToWrite> tensors;
    std::map<std::string, std::string> meta = {
        {"format", kStoreFormat},
        {"version", absl::StrCat(version)},
        {"base_version", absl::StrCat(result.base_version)},
        {"kind", anchor ? "anchor" : "delta"},
        {"writer", options_.writer},
        {"rank", absl::StrCat(rank)},
    };
    for (const ShardBuffer* s : shards) {
      const std::string dtype = tensor::SafetensorsDTypeName(s->spec.dtype());
      const int elem = DtypeBytes(dtype);
      const Box rect = BoxOf(s->spec);
      const std::vector<int64_t> global = GlobalShape(s->spec);
      result.dense_bytes += s->data.size();
      bool sparse = false;
      if (anchor) {
        shadows_[s->id].assign(s->data.begin(), s->data.end());
      } else if (elem == 8) {  // the codec handles 1-, 2- and 4-byte elements
        std::memcpy(shadows_[s->id].data(), s->data.data(), s->data.size());
      } else {
        auto enc =
            delta::EncodeDelta(absl::MakeSpan(shadows_[s->id]), s->data, elem, options_.threads);
        if (!enc.ok()) {
          remove_written();
          return absl::Status(enc.status().code(), absl::StrCat("tensor '", s->spec.name(),
                                                                "': ", enc.status().message()));
        }
        if (enc->kind == delta::DeltaEncoding::Kind::kPacked) {
          auto h = delta::ParseDeltaHeader(enc->packed);
          if (!h.ok()) {
            remove_written();
            return h.status();
          }
          owned.push_back(std::move(enc->packed));
          const std::vector<uint8_t>& packed = owned.back();
          owned.emplace_back();
          const int width = GlobalGaps(packed, *h, rect, global, owned.back());
          const int64_t count = static_cast<int64_t>(h->count);
          tensors.push_back(
              {s->spec.name() + ".indices", IndexDtype(width), {count}, owned.back()});
          tensors.push_back({s->spec.name() + ".values",
                             dtype,
                             {count},
                             absl::MakeConstSpan(packed).subspan(delta::kDeltaHeaderBytes +
                                                                 h->count * h->index_width)});
          result.changed_elements += h->count;
          sparse = true;
        } else {
          result.changed_elements += enc->changed_elems;
        }
      }
      if (!sparse) tensors.push_back({s->spec.name(), dtype, Sizes(rect), s->data});
      meta["shard:" + s->spec.name()] = json{
          {"dtype", dtype},
          {"global_shape", global},
          {"start", Starts(rect)},
          {"size", Sizes(rect)},
          {"encoding",
           sparse ? "sparse" : "dense"}}.dump();
    }
    const std::string file =
        absl::StrCat(VersionPrefix(version), ".", options_.writer, ".", rank, ".safetensors");
    auto written = WriteSafetensors(options_.dir + "/" + file, tensors, meta);
    if (!written.ok()) {
      remove_written();
      return written.status();
    }
    result.files.push_back(file);
    result.bytes_written += written->bytes;
    manifest["files"].push_back(
        {{"name", file}, {"bytes", written->bytes}, {"checksum", Hex(written->checksum)}});
  }
  manifest["bytes"] = result.bytes_written;
  manifest["dense_bytes"] = result.dense_bytes;
  const std::string text = manifest.dump(1);
  const std::string manifest_name = ManifestName(version, options_.writer);
  if (auto s = WriteFileAtomically(
          options_.dir + "/" + manifest_name,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
      !s.ok()) {
    remove_written();
    return s;
  }
  result.files.push_back(manifest_name);
  result.bytes_written += text.size();

  last_version_ = version;
  force_anchor_ = false;
  if (anchor) {
    previous_anchor_ = last_anchor_;
    last_anchor_ = version;
    source_set_ = set_key;
  }
  if (anchor && options_.prune && previous_anchor_ > 0) {
    // Keep the previous anchor and everything after it (a subscriber may still be on that
    // chain); manifests go first so no version is ever listed with files missing.
    std::vector<std::string> manifests, data;
    std::error_code ec;
    for (fs::directory_iterator it(options_.dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      uint64_t v = 0;
      std::string rest;
      if (!SplitVersion(name, &v, &rest) || v >= previous_anchor_) continue;
      if (rest.rfind(options_.writer + ".", 0) != 0) continue;
      (rest == options_.writer + ".json" ? manifests : data).push_back(it->path().string());
    }
    for (const auto& p : manifests) ::unlink(p.c_str());
    for (const auto& p : data) ::unlink(p.c_str());
  }
  return result;
}

DeltaSubscriber::DeltaSubscriber(StoreOptions options) : options_(std::move(options)) {
  std::vector<std::string> errors;  // the agent's configuration has checked the patterns
  renames_ = planner::RenameRules::Compile(options_.renames, &errors);
}

namespace {
std::string WhyNotApplicable(const std::map<std::string, Manifest>& manifests, uint64_t held_) {
  for (const auto& [writer, m] : manifests) {
    if (!m.error.empty()) return m.error;
    if (m.anchor) continue;
    if (held_ == 0) {
      return absl::StrCat("writer '", writer, "' wrote a delta on version ", m.base_version,
                          " and this agent holds no version yet; waiting for an anchor");
    }
    if (m.base_version != held_) {
      return absl::StrCat("writer '", writer, "' wrote a delta on version ", m.base_version,
                          " but this agent holds version ", held_, "; waiting for the next anchor");
    }
  }
  return absl::StrCat("a destination registered after version ", held_,
                      " holds no version yet; waiting for the next anchor");
}
}  // namespace

PollResult DeltaSubscriber::Poll(const std::vector<ShardBuffer>& destinations,
                                 const SubscriberHooks& hooks) {
  PollResult result;
  if (destinations.empty()) return result;
  std::set<uint64_t> ids;
  std::vector<ShardBuffer> fresh;  // registered since the held version was applied
  for (const auto& d : destinations) {
    ids.insert(d.id);
    if (!applied_ids_.count(d.id)) fresh.push_back(d);
  }
  // A fresh FP8 tensor is written together with its scale tensor, even an older one.
  std::set<std::string> fresh_scales;
  for (const auto& f : fresh) {
    if (f.spec.dtype() == v1::DTYPE_F8_E4M3)
      fresh_scales.insert(planner::ScaleTensorName(f.spec.name()));
  }
  for (const auto& d : destinations) {
    if (applied_ids_.count(d.id) && fresh_scales.count(d.spec.name())) fresh.push_back(d);
  }
  for (auto it = fp8_shadows_.begin(); it != fp8_shadows_.end();) {
    it = ids.count(it->first) ? std::next(it) : fp8_shadows_.erase(it);
  }
  auto versions = ListVersions(options_.dir);
  if (!versions.ok()) return result;  // the directory may not be mounted yet
  auto complete = [&](const std::map<std::string, Manifest>& m) {
    return static_cast<int>(m.size()) >= options_.writers;
  };
  auto all_anchors = [](const std::map<std::string, Manifest>& m) {
    for (const auto& [w, man] : m) {
      if (!man.anchor || !man.error.empty()) return false;
    }
    return true;
  };
  if (!fresh.empty() && !need_anchor_ && held_ > 0) {
    // Bring new destinations to the held version without events (the others hold it
    // already): the newest anchor at or before it, then the deltas up to it. Otherwise one
    // late registration would hold every destination back until the next anchor.
    uint64_t anchor = 0;
    for (auto it = versions->begin(); it != versions->end() && it->first <= held_; ++it) {
      if (complete(it->second) && all_anchors(it->second)) anchor = it->first;
    }
    bool caught_up = anchor > 0;
    uint64_t base = 0;
    for (auto it = versions->find(anchor); caught_up && it != versions->end() && it->first <= held_;
         ++it) {
      if (!complete(it->second)) continue;
      caught_up = Apply(it->first, base, fresh, SubscriberHooks{}).ok();
      base = it->first;
    }
    if (caught_up && base == held_) {
      for (const auto& d : fresh) applied_ids_.insert(d.id);
    } else {
      need_anchor_ = true;
    }
  } else if (!fresh.empty()) {
    need_anchor_ = true;  // holds nothing of ours yet
  }
  while (true) {
    const uint64_t floor = std::max(held_, skip_through_);
    uint64_t pick = 0;
    if (need_anchor_) {
      for (auto it = versions->rbegin(); it != versions->rend() && it->first > floor; ++it) {
        if (complete(it->second) && all_anchors(it->second)) {
          pick = it->first;
          break;
        }
      }
    } else {
      for (auto it = versions->upper_bound(floor); it != versions->end(); ++it) {
        if (complete(it->second)) {
          pick = it->first;
          break;
        }
      }
    }
    if (pick == 0 && need_anchor_) {
      // Say once per version why the deltas that arrive meanwhile are not applied.
      for (auto it = versions->upper_bound(floor); it != versions->end(); ++it) {
        if (!complete(it->second)) continue;
        const std::string reason =
            absl::StrCat("version ", it->first, " refused: ", WhyNotApplicable(it->second, held_));
        skip_through_ = it->first;
        result.refused.emplace_back(it->first, reason);
        if (hooks.refused) hooks.refused(it->first, reason);
      }
    }
    if (pick == 0) break;
    absl::Status s = Apply(pick, held_, destinations, hooks);
    if (s.ok()) {
      held_ = pick;
      applied_ids_ = ids;
      need_anchor_ = false;
      result.committed.push_back(pick);
      continue;
    }
    skip_through_ = pick;
    need_anchor_ = true;
    const std::string reason = absl::StrCat("version ", pick, " refused: ", s.message());
    result.refused.emplace_back(pick, reason);
    if (hooks.refused) hooks.refused(pick, reason);
  }
  return result;
}

absl::Status DeltaSubscriber::Apply(uint64_t v, uint64_t base,
                                    const std::vector<ShardBuffer>& destinations,
                                    const SubscriberHooks& hooks) {
  // Re-read the manifests: they are small, and this sees the version as it is now.
  auto versions = ListVersions(options_.dir);
  if (!versions.ok()) return versions.status();
  const auto& manifests = (*versions)[v];
  std::deque<SafetensorsFile> files;
  std::map<std::string, std::vector<Source>> sources;
  for (const auto& [writer, m] : manifests) {
    if (!m.error.empty()) return absl::DataLossError(m.error);
    if (!m.anchor && m.base_version != base) {
      return absl::FailedPreconditionError(
          absl::StrCat("writer '", writer, "' wrote a delta on version ", m.base_version,
                       " but this agent holds version ", base, "; waiting for the next anchor"));
    }
    for (const auto& ref : m.files) {
      const std::string path = options_.dir + "/" + ref.name;
      auto bytes = ReadWholeFile(path);
      if (!bytes.ok()) return bytes.status();
      if (bytes->size() != ref.bytes) {
        return absl::DataLossError(absl::StrCat(path, ": ", bytes->size(),
                                                " bytes, but the manifest says ", ref.bytes,
                                                " (truncated or still being copied?)"));
      }
      StreamHash hash;
      hash.Update(*bytes);
      if (Hex(hash.Final()) != ref.checksum) {
        return absl::DataLossError(absl::StrCat(path, ": checksum ", Hex(hash.Final()),
                                                " does not match the manifest's ", ref.checksum,
                                                " (corrupted)"));
      }
      auto file = SafetensorsFile::Parse(std::move(*bytes), path);
      if (!file.ok()) return file.status();
      files.push_back(std::move(*file));
      if (auto s = CollectSources(files.back(), v, sources); !s.ok()) return s;
    }
  }
  if (!renames_.empty()) {
    // As in the planner: with rename rules, sources go by their renamed (destination) names.
    std::map<std::string, std::vector<Source>> renamed;
    std::map<std::string, std::string> renamed_from;
    for (auto& [name, list] : sources) {
      const std::string to = renames_.Apply(name);
      auto [it, fresh] = renamed_from.try_emplace(to, name);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat("version ", v, ": sources ", it->second,
                                                       " and ", name,
                                                       " both map to destination name ", to));
      }
      renamed[to] = std::move(list);
    }
    sources = std::move(renamed);
  }
  // Fused destinations (qkv_proj = q ++ k ++ v, ...) take their parts' records, shifted.
  for (const auto& d : destinations) {
    if (!sources.count(d.spec.name())) AddFusedSources(d.spec.name(), options_.fusions, sources);
  }
  // Check every destination against the sources before writing anything.
  // FP8 destinations: quantised from a BF16 copy kept here, with their scale tensors.
  std::map<uint64_t, Fp8Target> fp8;
  std::set<uint64_t> scale_ids;
  for (const auto& d : destinations) {
    if (d.spec.dtype() != v1::DTYPE_F8_E4M3) continue;
    auto t = PlanFp8(d, destinations, sources, fp8_shadows_.count(d.id) > 0);
    if (!t.ok()) return t.status();
    scale_ids.insert(t->scale->id);
    fp8[d.id] = *t;
  }
  for (const auto& d : destinations) {
    if (scale_ids.count(d.id)) continue;  // written with its FP8 tensor
    const std::string& name = d.spec.name();
    const std::string where = absl::StrCat("destination tensor '", name, "' (rank ", d.rank, ")");
    auto it = sources.find(name);
    if (it == sources.end()) {
      return absl::NotFoundError(
          absl::StrCat(where, ": version ", v, " has no tensor of that name"));
    }
    const std::string dtype =
        fp8.count(d.id) ? "BF16" : tensor::SafetensorsDTypeName(d.spec.dtype());
    const Box rect = BoxOf(d.spec);
    uint64_t covered = 0;
    for (const Source& s : it->second) {
      if (s.dtype != dtype) {
        return absl::UnimplementedError(absl::StrCat(
            where, " is ", dtype.empty() ? "of an unknown dtype" : dtype, " but version ", v,
            " stores it as ", s.dtype, "; the storage path applies only the same dtype"));
      }
      if (s.global_shape != GlobalShape(d.spec)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": its global shape differs from ", s.file, "'s"));
      }
      Box in;
      if (tensor::Intersect(s.rect, rect, &in)) covered += in.Volume();
    }
    if (covered < static_cast<uint64_t>(rect.Volume())) {
      return absl::NotFoundError(absl::StrCat(where, " shard ", tensor::FormatBox(rect),
                                              ": version ", v, " covers only ", covered, " of its ",
                                              rect.Volume(), " elements"));
    }
  }
  if (hooks.begin) {
    if (auto s = hooks.begin(v); !s.ok()) return s;
  }
  for (const auto& d : destinations) {
    if (scale_ids.count(d.id)) continue;
    const Box rect = BoxOf(d.spec);
    auto f = fp8.find(d.id);
    uint8_t* out = d.data.data();
    int elem = tensor::DTypeBytes(d.spec.dtype());
    if (f != fp8.end()) {  // BF16 records land in the copy, which is quantised below
      auto& shadow = fp8_shadows_[d.id];
      shadow.resize(rect.Volume() * 2);
      out = shadow.data();
      elem = 2;
    }
    for (const Source& s : sources[d.spec.name()]) {
      Box in;
      if (!tensor::Intersect(s.rect, rect, &in)) continue;
      if (s.sparse) {
        ScatterInto(s, rect, elem, out);
      } else {
        CopyRect(s.dense.data(), s.rect, out, rect, in, elem);
      }
    }
    if (f != fp8.end()) {
      // Checked by PlanFp8 before anything was written; cannot fail here.
      (void)transform::ApplyTransformCpu(f->second.desc, out, d.data.data(), f->second.scales,
                                         options_.threads);
    }
  }
  if (hooks.commit) return hooks.commit(v);
  return absl::OkStatus();
}

}  // namespace wb::storage
