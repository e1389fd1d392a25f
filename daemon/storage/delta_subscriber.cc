// The subscribing side of the storage path: picks complete versions up in order, reads and checks
// every file of one, maps stored names to destinations (renames, fusions), then writes each
// destination shard (FP8 ones quantised from a BF16 copy) between begin and commit.
#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/planner/name_rules.h"
#include "common/tensor/dtype.h"
#include "daemon/registry/bus_guard.h"
#include "daemon/storage/delta_store.h"
#include "daemon/storage/manifest_mac.h"
#include "daemon/storage/safetensors.h"
#include "daemon/storage/sparse_file.h"
#include "daemon/storage/store_layout.h"
#include "daemon/transform/transform.h"

namespace wb::storage {

namespace v1 = weightbeam::v1;

namespace {

// Where an FP8 destination's quantised bytes and block scales go.
struct Fp8Target {
  const ShardBuffer *scale = nullptr;
  transform::TransformDesc desc;
  float *scales = nullptr;  // the first scale of this shard's blocks
};

// Checks an FP8 e4m3 destination (2-D, BF16 in the files, shard on 128-element block boundaries)
// and finds its `<name>_scale_inv` F32 destination (same owner) covering its blocks. Without a BF16
// copy yet, only dense sources (an anchor) can start one.
absl::StatusOr<Fp8Target> PlanFp8(const ShardBuffer &d, const std::vector<ShardBuffer> &all,
                                  const std::map<std::string, std::vector<Source>> &sources,
                                  bool has_copy) {
  constexpr int64_t kBlock = transform::kFp8BlockSize;
  const std::string where =
      absl::StrCat("FP8 destination tensor '", d.spec.name(), "' (rank ", d.rank, ")");
  const Box rect = BoxOf(d.spec);
  if (rect.ndim != 2 || rect.start[0] % kBlock != 0 || rect.start[1] % kBlock != 0) {
    return absl::UnimplementedError(
        absl::StrCat(where,
                     ": the storage path quantises 2-D shards that start on "
                     "128-element blocks, not ",
                     tensor::FormatBox(rect)));
  }
  const std::string scale_name = planner::ScaleTensorName(d.spec.name());
  Fp8Target t;
  for (const auto &c : all) {
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
      for (const Source &s : it->second) {
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
  t.scales = reinterpret_cast<float *>(t.scale->data.data()) +
             (b0 - srect.start[0]) * srect.size[1] + (b1 - srect.start[1]);
  return t;
}

// Copies between registered memory and our own under the SIGBUS guard; false when the
// registered side was cut short (the owner shrank its shared-memory object).
bool GuardedCopy(void *dst, const void *src, size_t n) {
  return registry::RunBusGuarded([&] { std::memcpy(dst, src, n); });
}

// The error of a destination whose memory is gone.
absl::Status Gone(const ShardBuffer &d, const char *what) {
  return absl::DataLossError(absl::StrCat(
      "destination tensor '", d.spec.name(), "' (rank ", d.rank, "): its memory could not be ",
      what,
      " (SIGBUS: its owner shrank the shared-memory object under the registered range); "
      "re-register it"));
}

std::string WhyNotApplicable(const std::map<std::string, Manifest> &manifests, uint64_t held_) {
  for (const auto &[writer, m] : manifests) {
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

DeltaSubscriber::DeltaSubscriber(StoreOptions options) : options_(std::move(options)) {
  std::vector<std::string> errors;  // the agent's configuration has checked the patterns
  renames_ = planner::RenameRules::Compile(options_.renames, &errors);
}

PollResult DeltaSubscriber::Poll(const std::vector<ShardBuffer> &destinations,
                                 const SubscriberHooks &hooks) {
  PollResult result;
  if (destinations.empty()) return result;
  std::set<uint64_t> ids;
  std::vector<ShardBuffer> fresh;  // registered since the held version was applied
  for (const auto &d : destinations) {
    ids.insert(d.id);
    if (!applied_ids_.count(d.id)) fresh.push_back(d);
  }
  // A fresh FP8 tensor is written together with its scale tensor, even an older one.
  std::set<std::string> fresh_scales;
  for (const auto &f : fresh) {
    if (f.spec.dtype() == v1::DTYPE_F8_E4M3)
      fresh_scales.insert(planner::ScaleTensorName(f.spec.name()));
  }
  for (const auto &d : destinations) {
    if (applied_ids_.count(d.id) && fresh_scales.count(d.spec.name())) fresh.push_back(d);
  }
  for (auto it = fp8_shadows_.begin(); it != fp8_shadows_.end();) {
    it = ids.count(it->first) ? std::next(it) : fp8_shadows_.erase(it);
  }
  std::vector<std::string> ignored;
  auto versions = ListVersions(options_.dir, options_.manifest_key, &ignored);
  if (!versions.ok()) return result;  // the directory may not be mounted yet
  // Names that are not manifest names, and manifests that cannot be used (malformed, or without
  // a valid MAC under a storage key), are reported once and left out: an unusable manifest never
  // counts towards a complete version, so a forged one (say of version 2^64 - 1) can neither be
  // applied nor make the subscriber skip the genuine versions below it.
  std::set<std::string> still_present;
  for (const auto &what : ignored) {
    still_present.insert(what);
    if (reported_.count(what)) continue;
    result.ignored.push_back(what);
    if (hooks.ignored) hooks.ignored(what);
  }
  const uint64_t reported_floor = std::max(held_, skip_through_);
  for (auto v = versions->begin(); v != versions->end();) {
    std::vector<std::string> unusable;
    for (auto m = v->second.begin(); m != v->second.end();) {
      if (m->second.error.empty()) {
        ++m;
        continue;
      }
      still_present.insert(m->second.error);
      if (v->first > reported_floor && !reported_.count(m->second.error)) {
        unusable.push_back(m->second.error);
      }
      m = v->second.erase(m);
    }
    // Beside a complete set of usable manifests, an unusable one is only ignored (the version
    // is applied from the usable ones); otherwise the watchers hear why the version is refused.
    const bool usable = static_cast<int>(v->second.size()) >= options_.writers;
    for (const auto &error : unusable) {
      if (usable) {
        // "<name>: <why>", as the ignored names are reported.
        const std::string what = absl::StartsWith(error, options_.dir + "/")
                                     ? error.substr(options_.dir.size() + 1)
                                     : error;
        result.ignored.push_back(what);
        if (hooks.ignored) hooks.ignored(what);
        continue;
      }
      const std::string reason = absl::StrCat("version ", v->first, " refused: ", error);
      result.refused.emplace_back(v->first, reason);
      if (hooks.refused) hooks.refused(v->first, reason);
    }
    v = v->second.empty() ? versions->erase(v) : std::next(v);
  }
  reported_ = std::move(still_present);
  auto complete = [&](const std::map<std::string, Manifest> &m) {
    return static_cast<int>(m.size()) >= options_.writers;
  };
  auto all_anchors = [](const std::map<std::string, Manifest> &m) {
    for (const auto &[w, man] : m) {
      if (!man.anchor || !man.error.empty()) return false;
    }
    return true;
  };
  if (!fresh.empty() && !need_anchor_ && held_ > 0) {
    // Bring new destinations to the held version without events (the others hold it already): the
    // newest anchor at or before it, then the deltas up to it. Otherwise one late registration
    // would hold every destination back until the next anchor.
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
      for (const auto &d : fresh) applied_ids_.insert(d.id);
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
                                    const std::vector<ShardBuffer> &destinations,
                                    const SubscriberHooks &hooks) {
  // Re-read the manifests: they are small, and this sees the version as it is now. Unusable
  // ones (malformed, or without a valid MAC under a storage key) are left out as Poll leaves
  // them out: a stray or forged manifest beside a genuine version never blocks it.
  auto versions = ListVersions(options_.dir, options_.manifest_key);
  if (!versions.ok()) return versions.status();
  std::map<std::string, Manifest> manifests;
  for (auto &[writer, m] : (*versions)[v]) {
    if (m.error.empty()) manifests.emplace(writer, std::move(m));
  }
  if (static_cast<int>(manifests.size()) < options_.writers) {
    return absl::DataLossError(absl::StrCat("version ", v, " has ", manifests.size(),
                                            " usable manifest(s) now, ", options_.writers,
                                            " expected (changed since it was listed)"));
  }
  std::deque<SafetensorsFile> files;
  std::map<std::string, std::vector<Source>> sources;
  for (const auto &[writer, m] : manifests) {
    if (!m.anchor && m.base_version != base) {
      return absl::FailedPreconditionError(
          absl::StrCat("writer '", writer, "' wrote a delta on version ", m.base_version,
                       " but this agent holds version ", base, "; waiting for the next anchor"));
    }
    for (const auto &ref : m.files) {
      const std::string path = options_.dir + "/" + ref.name;
      auto bytes = ReadWholeFile(path, ref.bytes);  // a bigger file is refused unread
      if (!bytes.ok()) return bytes.status();
      if (bytes->size() != ref.bytes) {
        return absl::DataLossError(absl::StrCat(path, ": ", bytes->size(),
                                                " bytes, but the manifest says ", ref.bytes,
                                                " (truncated or still being copied?)"));
      }
      if (!ref.sha256.empty()) {  // always there under a storage key (the MAC covers it)
        const std::string sha = Sha256Hex(*bytes);
        if (sha != ref.sha256) {
          return absl::DataLossError(absl::StrCat(path, ": SHA-256 ", sha,
                                                  " does not match the manifest's ", ref.sha256,
                                                  " (altered or corrupted)"));
        }
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
    for (auto &[name, list] : sources) {
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
  for (const auto &d : destinations) {
    if (!sources.count(d.spec.name())) AddFusedSources(d.spec.name(), options_.fusions, sources);
  }
  // Check every destination against the sources before writing anything.
  // FP8 destinations: quantised from a BF16 copy kept here, with their scale tensors.
  std::map<uint64_t, Fp8Target> fp8;
  std::set<uint64_t> scale_ids;
  for (const auto &d : destinations) {
    if (d.spec.dtype() != v1::DTYPE_F8_E4M3) continue;
    auto t = PlanFp8(d, destinations, sources, fp8_shadows_.count(d.id) > 0);
    if (!t.ok()) return t.status();
    scale_ids.insert(t->scale->id);
    fp8[d.id] = *t;
  }
  for (const auto &d : destinations) {
    if (scale_ids.count(d.id)) continue;  // written with its FP8 tensor
    const std::string &name = d.spec.name();
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
    for (const Source &s : it->second) {
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
      // Capped at the shard's volume (<= 2^62): many overlapping sources cannot wrap the sum.
      if (tensor::Intersect(s.rect, rect, &in)) {
        covered = std::min<uint64_t>(covered + in.Volume(), rect.Volume());
      }
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
  // The destinations are the inference processes' shared memory: every access is one guarded
  // copy between it and memory of our own (GuardedCopy), so an owner that shrank its object
  // refuses the version instead of killing the agent.
  std::vector<uint8_t> scratch, scale_scratch;
  for (const auto &d : destinations) {
    if (scale_ids.count(d.id)) continue;
    const Box rect = BoxOf(d.spec);
    auto f = fp8.find(d.id);
    uint8_t *out = nullptr;
    int elem = tensor::DTypeBytes(d.spec.dtype());
    if (f != fp8.end()) {  // BF16 records land in the copy, which is quantised below
      auto &shadow = fp8_shadows_[d.id];
      shadow.resize(rect.Volume() * 2);
      out = shadow.data();
      elem = 2;
    } else {
      // Sparse records patch what the destination holds: read it first.
      scratch.resize(d.data.size());
      if (!GuardedCopy(scratch.data(), d.data.data(), d.data.size())) return Gone(d, "read");
      out = scratch.data();
    }
    for (const Source &s : sources[d.spec.name()]) {
      Box in;
      if (!tensor::Intersect(s.rect, rect, &in)) continue;
      if (s.sparse) {
        ScatterInto(s, rect, elem, out);
      } else {
        CopyRect(s.dense.data(), s.rect, out, rect, in, elem);
      }
    }
    if (f != fp8.end()) {
      // Quantised into our own copies of the FP8 tensor and of its whole scale tensor, which
      // then go out in two copies.
      const ShardBuffer &scale = *f->second.scale;
      scratch.resize(d.data.size());
      scale_scratch.resize(scale.data.size());
      if (!GuardedCopy(scale_scratch.data(), scale.data.data(), scale.data.size())) {
        return Gone(scale, "read");
      }
      float *scales = reinterpret_cast<float *>(scale_scratch.data()) +
                      (f->second.scales - reinterpret_cast<float *>(scale.data.data()));
      // Checked by PlanFp8 before anything was written; cannot fail here.
      (void)transform::ApplyTransformCpu(f->second.desc, out, scratch.data(), scales,
                                         options_.threads);
      if (!GuardedCopy(scale.data.data(), scale_scratch.data(), scale.data.size())) {
        return Gone(scale, "written");
      }
    }
    if (!GuardedCopy(d.data.data(), scratch.data(), d.data.size())) return Gone(d, "written");
  }
  if (hooks.commit) return hooks.commit(v);
  return absl::OkStatus();
}

}  // namespace wb::storage
