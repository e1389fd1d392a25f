#include "tests/demo/demo_roles.h"

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
#include "tests/demo/gpu_buffers.h"
#include "tests/demo/role_support.h"
#include "tests/demo/synthetic_weights.h"

namespace wb::demo {

namespace v1 = weightbeam::v1;
using planner::TensorEntry;

namespace {

// Calls fn(global_begin, count, local_offset) for each row-major run of an entry's shard.
template <typename Fn>
void ForEachRun(const TensorEntry& e, Fn fn) {
  const Rect r = ShardRect(e);
  if (r.nc == r.cols) {
    fn(static_cast<uint64_t>(r.r0 * r.cols), static_cast<uint64_t>(r.nr * r.cols), uint64_t{0});
    return;
  }
  for (int64_t i = 0; i < r.nr; ++i) {
    fn(static_cast<uint64_t>((r.r0 + i) * r.cols + r.c0), static_cast<uint64_t>(r.nc),
       static_cast<uint64_t>(i * r.nc));
  }
}

int Fail(const std::string& who, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", who.c_str(), std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunTrainer(const DemoShape& shape, int rank, const std::string& socket, bool gpu) {
  auto model = BuildDemoModel(shape);
  if (!model.ok()) {
    std::fprintf(stderr, "trainer %d: %s\n", rank, std::string(model.status().message()).c_str());
    return 1;
  }
  auto entries = EntriesFor(*model, planner::Role::kTrainer, rank);
  const std::string who = absl::StrCat("trainer ", rank);
  auto side = OpenSide(socket, {v1::ROLE_TRAINER, rank, 0}, entries, "demo", who);
  if (!side) return 1;
  auto* base = static_cast<uint8_t*>(side->reg.buffer.data());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    auto* values = reinterpret_cast<uint16_t*>(base + side->reg.offsets[i]);
    const uint64_t h = NameHash(e.name);
    ForEachRun(e, [&](uint64_t begin, uint64_t count, uint64_t local) {
      for (uint64_t k = 0; k < count; ++k) values[local + k] = BaseValue(h, begin + k);
    });
    if (gpu) continue;  // registered below, from device memory
    auto s =
        side->session.Register(InfoOf(e), side->reg.buffer, side->reg.offsets[i], EntryBytes(e));
    if (!s.ok()) return Fail(who, s);
  }
  absl::StatusOr<DeviceCopy> device = absl::FailedPreconditionError("not --gpu");
  if (gpu) {
    device = DeviceCopy::Create(side->reg);
    if (!device.ok()) return Fail(who, device.status());
    if (auto s = device->Upload(); !s.ok()) return Fail(who, s);
    if (auto s = device->RegisterAll(side->session, entries); !s.ok()) return Fail(who, s);
  }
  absl::Status upload = absl::OkStatus();
  ServeTrainerLines(entries, [&](uint32_t version) {
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      auto* values = reinterpret_cast<uint16_t*>(base + side->reg.offsets[i]);
      const uint64_t h = NameHash(e.name), total = Total(e.shape);
      ForEachRun(e, [&](uint64_t begin, uint64_t count, uint64_t local) {
        ApplyVersion(h, total, version, begin, begin + count, values + local);
      });
    }
    if (gpu && upload.ok()) upload = device->Upload();
  });
  return upload.ok() ? 0 : Fail(who, upload);
}

namespace {

// The inference worker's own copy of every source tensor it needs, at the latest version.
class Mirror {
 public:
  explicit Mirror(const planner::ModelSpec& spec) {
    for (const auto& t : spec.tensors) shapes_[t.name] = t.shape;
  }
  const std::vector<uint16_t>& Get(const std::string& name) {
    auto it = values_.find(name);
    if (it != values_.end()) return it->second;
    auto& v = values_[name];
    const uint64_t total = Total(shapes_.at(name)), h = NameHash(name);
    v.resize(total);
    for (uint64_t i = 0; i < total; ++i) v[i] = BaseValue(h, i);
    for (uint32_t u = 1; u <= version_; ++u) ApplyVersion(h, total, u, 0, total, v.data());
    return v;
  }
  void Advance(uint32_t version) {
    for (; version_ < version;) {
      ++version_;
      for (auto& [name, v] : values_) {
        ApplyVersion(NameHash(name), v.size(), version_, 0, v.size(), v.data());
      }
    }
  }
  const std::vector<int64_t>& Shape(const std::string& name) const { return shapes_.at(name); }
  bool Has(const std::string& name) const { return shapes_.count(name) > 0; }

 private:
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, std::vector<uint16_t>> values_;
  uint32_t version_ = 0;
};

// The destination's expected BF16 values (rows x cols of its shard), gathered from the source
// tensors it is fused from.
std::vector<uint16_t> ExpectedBf16(const TensorEntry& e, Mirror& mirror, uint64_t* rows,
                                   uint64_t* cols) {
  const std::vector<std::string> parts = FusionParts(e.name);
  std::vector<uint16_t> out;
  const Rect rect = ShardRect(e);
  const int64_t C = rect.cols, r0 = rect.r0, nr = rect.nr, c0 = rect.c0, nc = rect.nc;
  out.resize(static_cast<size_t>(nr * nc));
  for (int64_t i = 0; i < nr; ++i) {
    int64_t g = r0 + i, part_start = 0;
    for (const auto& p : parts) {
      int64_t prow = mirror.Shape(p)[0];
      if (g < part_start + prow) {
        const auto& src = mirror.Get(p);
        std::memcpy(&out[static_cast<size_t>(i * nc)], &src[(g - part_start) * C + c0],
                    static_cast<size_t>(nc) * 2);
        break;
      }
      part_start += prow;
    }
  }
  *rows = static_cast<uint64_t>(nr);
  *cols = static_cast<uint64_t>(nc);
  return out;
}

}  // namespace

int RunInference(const DemoShape& shape, int rank, const std::string& socket, bool gpu) {
  auto model = BuildDemoModel(shape);
  if (!model.ok()) return 1;
  auto entries = EntriesFor(*model, planner::Role::kInference, rank);
  const std::string who = absl::StrCat("inference ", rank);
  auto side = OpenSide(socket, {v1::ROLE_INFERENCE, rank, 0}, entries, "demo", who);
  if (!side) return 1;
  for (size_t i = 0; i < entries.size() && !gpu; ++i) {  // --gpu: registered below
    auto s = side->session.Register(InfoOf(entries[i]), side->reg.buffer, side->reg.offsets[i],
                                    EntryBytes(entries[i]));
    if (!s.ok()) return Fail(who, s);
  }
  absl::StatusOr<DeviceCopy> device = absl::FailedPreconditionError("not --gpu");
  if (gpu) {
    device = DeviceCopy::Create(side->reg);
    if (!device.ok()) return Fail(who, device.status());
    if (auto s = device->RegisterAll(side->session, entries); !s.ok()) return Fail(who, s);
  }
  if (!side->session.Watch().ok()) return 1;
  Mirror mirror(model->spec);
  return ServeInferenceChecks(
      side->session, entries, side->reg, who, /*say_gone=*/false,
      [&](uint32_t version) -> absl::Status {
        mirror.Advance(version);
        // With --gpu the destination bytes are checked on the host: the device buffer copied back.
        if (!gpu) return absl::OkStatus();
        absl::Status s = device->Download();
        if (!s.ok())
          return absl::Status(s.code(),
                              absl::StrCat("copying the device buffer back: ", s.message()));
        return s;
      },
      [&](const TensorEntry& e, uint64_t* rows, uint64_t* cols) {
        return ExpectedBf16(e, mirror, rows, cols);
      });
}

}  // namespace wb::demo
