// The publishing side of the storage path: each version as one safetensors file per trainer rank
// (dense anchors, or sparse deltas against a host shadow) and the writer's manifest last; older
// chains are pruned once a new anchor is complete.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "daemon/delta/delta_codec.h"
#include "daemon/registry/bus_guard.h"
#include "daemon/storage/delta_store.h"
#include "daemon/storage/manifest_mac.h"
#include "daemon/storage/safetensors.h"
#include "daemon/storage/sparse_file.h"
#include "daemon/storage/store_layout.h"

namespace wb::storage {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Copies out of registered memory under the SIGBUS guard; false when it was cut short.
bool GuardedCopy(void *dst, const void *src, size_t n) {
  return registry::RunBusGuarded([&] { std::memcpy(dst, src, n); });
}

absl::Status Gone(const ShardBuffer &s) {
  return absl::DataLossError(absl::StrCat(
      "tensor '", s.spec.name(), "' (rank ", s.rank,
      "): its memory could not be read (SIGBUS: "
      "its owner shrank the shared-memory object under the registered range); re-register it"));
}

}  // namespace

DeltaPublisher::DeltaPublisher(StoreOptions options) : options_(std::move(options)) {}

absl::Status DeltaPublisher::Resume() {
  auto versions = ListVersions(options_.dir, options_.manifest_key);
  if (!versions.ok()) return versions.status();
  for (const auto &[v, manifests] : *versions) {
    auto own = manifests.find(options_.writer);
    if (own == manifests.end()) continue;
    // Under a key, a manifest without its MAC is not ours: a forged 2^64 - 1 must not stop us.
    if (!options_.manifest_key.empty() && !own->second.error.empty()) continue;
    last_version_ = std::max(last_version_, v);
  }
  return absl::OkStatus();
}

absl::StatusOr<PublishResult> DeltaPublisher::Publish(uint64_t version,
                                                      const std::vector<ShardBuffer> &sources) {
  if (version == 0 || version <= last_version_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", version, " is not newer than the last published version ", last_version_));
  }
  // One file per trainer rank; a shard held twice (replicas) is written once.
  std::map<int, std::vector<const ShardBuffer *>> by_rank;
  std::set<std::string> seen;
  std::string set_key;
  for (const auto &s : sources) {
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
        "nothing to publish: no trainer tensors are registered with this "
        "agent");
  }
  const bool anchor = force_anchor_ || last_anchor_ == 0 || set_key != source_set_ ||
                      version - last_anchor_ >= static_cast<uint64_t>(options_.anchor_every);
  if (anchor) shadows_.clear();
  force_anchor_ = true;  // until this version is written completely

  PublishResult result;
  result.version = version;
  result.anchor = anchor;
  result.base_version = anchor ? 0 : last_version_;
  Manifest signed_part;  // what the MAC covers
  signed_part.writer = options_.writer;
  signed_part.version = version;
  signed_part.base_version = result.base_version;
  signed_part.anchor = anchor;
  const bool sign = !options_.manifest_key.empty();
  json manifest = {{"format", kStoreFormat},
                   {"version", version},
                   {"base_version", result.base_version},
                   {"kind", anchor ? "anchor" : "delta"},
                   {"writer", options_.writer},
                   {"files", json::array()}};
  auto remove_written = [&] {
    for (const auto &f : result.files) ::unlink((options_.dir + "/" + f).c_str());
  };
  std::vector<uint8_t> scratch;  // a source's bytes while its delta is encoded
  for (const auto &[rank, shards] : by_rank) {
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
    for (const ShardBuffer *s : shards) {
      const std::string dtype = tensor::SafetensorsDTypeName(s->spec.dtype());
      const int elem = DtypeBytes(dtype);
      const Box rect = BoxOf(s->spec);
      const std::vector<int64_t> global = GlobalShape(s->spec);
      result.dense_bytes += s->data.size();
      bool sparse = false;
      // The sources are the trainers' shared memory: read once, by a guarded copy into memory
      // of our own (the shadow, or the scratch buffer a delta is encoded from), so an owner
      // that shrank its object fails this version instead of killing the agent.
      std::vector<uint8_t> &shadow = shadows_[s->id];
      if (anchor || elem == 8) {  // the codec handles 1-, 2- and 4-byte elements
        shadow.resize(s->data.size());
        if (!GuardedCopy(shadow.data(), s->data.data(), s->data.size())) {
          remove_written();
          return Gone(*s);
        }
      } else {
        scratch.resize(s->data.size());
        if (!GuardedCopy(scratch.data(), s->data.data(), s->data.size())) {
          remove_written();
          return Gone(*s);
        }
        auto enc = delta::EncodeDelta(absl::MakeSpan(shadow), scratch, elem, options_.threads);
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
          const std::vector<uint8_t> &packed = owned.back();
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
      // The shadow holds this version's bytes now, whichever branch ran.
      if (!sparse) tensors.push_back({s->spec.name(), dtype, Sizes(rect), shadow});
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
    Sha256 sha;
    ByteObserver observe;
    if (sign) observe = [&sha](absl::Span<const uint8_t> piece) { sha.Update(piece); };
    auto written = WriteSafetensors(options_.dir + "/" + file, tensors, meta, observe);
    if (!written.ok()) {
      remove_written();
      return written.status();
    }
    result.files.push_back(file);
    result.bytes_written += written->bytes;
    FileRef ref{file, written->bytes, Hex(written->checksum), sign ? sha.HexFinal() : ""};
    json entry = {{"name", ref.name}, {"bytes", ref.bytes}, {"checksum", ref.checksum}};
    if (sign) entry["sha256"] = ref.sha256;
    manifest["files"].push_back(std::move(entry));
    signed_part.files.push_back(std::move(ref));
  }
  if (sign) manifest["mac"] = ManifestMac(options_.manifest_key, signed_part);
  manifest["bytes"] = result.bytes_written;
  manifest["dense_bytes"] = result.dense_bytes;
  const std::string text = manifest.dump(1);
  const std::string manifest_name = ManifestName(version, options_.writer);
  if (auto s = WriteFileAtomically(
          options_.dir + "/" + manifest_name,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t *>(text.data()), text.size()));
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
    // Keep the previous anchor and everything after it (a subscriber may still be on that chain);
    // manifests go first so no version is ever listed with files missing.
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
    for (const auto &p : manifests) ::unlink(p.c_str());
    for (const auto &p : data) ::unlink(p.c_str());
  }
  return result;
}

}  // namespace wb::storage
