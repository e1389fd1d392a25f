#include "tests/cluster/cluster_roles.h"

#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "config/config.h"
#include "daemon/transform/transform.h"
#include "tests/demo/role_support.h"
#include "tests/demo/synthetic_weights.h"

namespace wb::cluster {

namespace v1 = weightbeam::v1;
using demo::ApplyVersion;
using demo::BaseValue;
using demo::Bf16ToFloat;
using demo::CheckFp8;
using demo::FirstMismatch;
using demo::FusionParts;
using demo::InfoOf;
using demo::NameHash;
using demo::Rect;
using demo::RegisterAll;
using demo::ServeInferenceChecks;
using demo::ServeTrainerLines;
using demo::ShardRect;
using demo::StdinClosed;
using demo::Total;
using demo::WriteF32;
using planner::TensorEntry;

namespace {

// The synthetic BF16 values of whole rows [r0, r0 + nr) of a source tensor, kept at the
// latest version. Rows (not the shard's columns) because a version's changes are a stream over
// row-major indices: one pass over the row block applies them.
struct RowBlock {
  uint64_t hash = 0, total = 0, begin = 0, end = 0;
  std::vector<uint16_t> values;
};

class Reference {
 public:
  explicit Reference(const planner::ModelSpec& spec) {
    for (const auto& t : spec.tensors) shapes_[t.name] = t.shape;
  }
  const std::vector<int64_t>& Shape(const std::string& name) const { return shapes_.at(name); }

  const RowBlock& Rows(const std::string& name, int64_t r0, int64_t nr) {
    auto key = std::make_tuple(name, r0, nr);
    auto it = blocks_.find(key);
    if (it != blocks_.end()) return it->second;
    const auto& shape = shapes_.at(name);
    const int64_t cols = shape.size() < 2 ? 1 : Total(shape) / shape[0];
    RowBlock& b = blocks_[key];
    b.hash = NameHash(name);
    b.total = Total(shape);
    b.begin = static_cast<uint64_t>(shape.size() < 2 ? 0 : r0 * cols);
    b.end = shape.size() < 2 ? b.total : static_cast<uint64_t>((r0 + nr) * cols);
    b.values.resize(b.end - b.begin);
    for (uint64_t i = b.begin; i < b.end; ++i) b.values[i - b.begin] = BaseValue(b.hash, i);
    for (uint32_t u = 1; u <= version_; ++u) {
      ApplyVersion(b.hash, b.total, u, b.begin, b.end, b.values.data());
    }
    return b;
  }

  void Advance(uint32_t version) {
    for (; version_ < version;) {
      ++version_;
      for (auto& [key, b] : blocks_) {
        ApplyVersion(b.hash, b.total, version_, b.begin, b.end, b.values.data());
      }
    }
  }

 private:
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::tuple<std::string, int64_t, int64_t>, RowBlock> blocks_;
  uint32_t version_ = 0;
};

// The destination's expected BF16 values (its shard, rows x cols), gathered from the source
// tensors it is fused from.
std::vector<uint16_t> ExpectedBf16(const TensorEntry& e, Reference& ref, uint64_t* rows,
                                   uint64_t* cols) {
  const std::vector<std::string> parts = FusionParts(e.name);
  const Rect r = ShardRect(e);
  std::vector<uint16_t> out(static_cast<size_t>(r.nr * r.nc));
  int64_t part_start = 0;
  for (const auto& p : parts) {
    const int64_t prow = e.shape.size() < 2 ? 1 : ref.Shape(p)[0];
    const int64_t lo = std::max(r.r0, part_start), hi = std::min(r.r0 + r.nr, part_start + prow);
    if (lo < hi) {
      const RowBlock& b = ref.Rows(p, lo - part_start, hi - lo);
      for (int64_t g = lo; g < hi; ++g) {
        std::memcpy(&out[static_cast<size_t>((g - r.r0) * r.nc)],
                    &b.values[static_cast<size_t>((g - lo) * r.cols + r.c0)],
                    static_cast<size_t>(r.nc) * 2);
      }
    }
    part_start += prow;
  }
  *rows = static_cast<uint64_t>(r.nr);
  *cols = static_cast<uint64_t>(r.nc);
  return out;
}

}  // namespace

int RunTrainer(const ClusterShape& shape, int rank, const std::string& socket) {
  auto model = BuildClusterModel(shape);
  if (!model.ok()) {
    std::fprintf(stderr, "trainer %d: %s\n", rank, std::string(model.status().message()).c_str());
    return 1;
  }
  const auto entries = TrainerEntries(*model, shape, rank);
  const std::string who = absl::StrCat("trainer ", rank);
  auto side = demo::OpenSide(socket, {v1::ROLE_TRAINER, rank, TrainerReplica(shape, rank)}, entries,
                             "cluster", who);
  if (!side) return 1;
  auto* base = static_cast<uint8_t*>(side->reg.buffer.data());
  // Trainers hold dim-0 shards: one contiguous element run [begin, end) each. Float32 tensors
  // (the router's correction bias) keep their BF16-valued synthetic values aside.
  std::vector<uint64_t> begin(entries.size()), end(entries.size());
  std::map<size_t, std::vector<uint16_t>> f32;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const Rect r = ShardRect(e);
    begin[i] = static_cast<uint64_t>(r.r0 * r.cols + r.c0);
    end[i] = begin[i] + EntryElements(e);
    const uint64_t h = NameHash(e.name);
    uint16_t* values = reinterpret_cast<uint16_t*>(base + side->reg.offsets[i]);
    if (e.dtype == v1::DTYPE_F32)
      values = (f32[i] = std::vector<uint16_t>(end[i] - begin[i])).data();
    for (uint64_t k = begin[i]; k < end[i]; ++k) values[k - begin[i]] = BaseValue(h, k);
    if (e.dtype == v1::DTYPE_F32) {
      WriteF32(values, end[i] - begin[i], reinterpret_cast<float*>(base + side->reg.offsets[i]));
    }
  }
  if (!RegisterAll(*side, entries, who)) return 1;
  ServeTrainerLines(entries, [&](uint32_t version) {
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      auto it = f32.find(i);
      uint16_t* values = it != f32.end() ? it->second.data()
                                         : reinterpret_cast<uint16_t*>(base + side->reg.offsets[i]);
      ApplyVersion(NameHash(e.name), Total(e.shape), version, begin[i], end[i], values);
      if (it != f32.end()) {
        WriteF32(values, end[i] - begin[i], reinterpret_cast<float*>(base + side->reg.offsets[i]));
      }
    }
  });
  return 0;
}

int RunInference(const ClusterShape& shape, int replica, int rank, const std::string& socket) {
  auto model = BuildClusterModel(shape);
  if (!model.ok()) return 1;
  const auto entries = InferenceEntries(*model, replica, rank);
  const std::string who = absl::StrCat("inference ", replica, "/", rank);
  auto side = demo::OpenSide(socket, {v1::ROLE_INFERENCE, rank, replica}, entries, "cluster", who);
  if (!side) return 1;
  if (!RegisterAll(*side, entries, who) || !side->session.Watch().ok()) return 1;
  Reference ref(model->spec);
  return ServeInferenceChecks(
      side->session, entries, side->reg, who, /*say_gone=*/true,
      [&](uint32_t version) {
        ref.Advance(version);
        return absl::OkStatus();
      },
      [&](const TensorEntry& e, uint64_t* rows, uint64_t* cols) {
        return ExpectedBf16(e, ref, rows, cols);
      });
}

}  // namespace wb::cluster
