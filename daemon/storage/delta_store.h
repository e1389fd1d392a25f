// The storage path of delta mode: a publisher writes each weight version into a directory (a
// mounted bucket or shared file system) as sparse safetensors files (`<name>.indices`,
// `<name>.values`, global element indices) with periodic dense anchors; a subscriber on another
// machine picks complete versions up in order, validates every file, then applies them into
// its destination buffers (any sharding of the same dtype) between begin and commit.
//
// Directory layout, per version v (20 digits, so names sort by version) and writer (agent):
//   <v>.<writer>.<rank>.safetensors   the tensors of trainer rank <rank> held by that agent
//   <v>.<writer>.json                 the manifest, written last: kind, base version, files
//                                     with sizes and checksums (and, with a cluster token, their
//                                     SHA-256 and an HMAC of it all). A version is complete
//                                     when every expected writer's manifest is there.
//
// The implementation: store_layout (names, manifests), sparse_file (tensors in the files),
// delta_publisher.cc and delta_subscriber.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/planner/name_rules.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::storage {

inline constexpr char kStoreFormat[] = "weightbeam-delta/1";

struct StoreOptions {
  std::string dir;
  std::string writer = "agent";  // publisher: the name in its file names (the agent's name)
  int anchor_every = 16;         // publisher: a dense anchor at least every N versions
  bool prune = true;             // publisher: drop versions older than the previous anchor
  int writers = 1;               // subscriber: publishing agents that make a version complete
  int threads = 0;               // delta encoding threads (0: hardware concurrency)
  // DeriveManifestKey(cluster token), or empty. Publisher: signs every manifest (HMAC-SHA256,
  // with a SHA-256 of each file). Subscriber: refuses manifests without a valid MAC and files
  // whose SHA-256 differs. Empty: manifests are unsigned and trusted as they are.
  std::string manifest_key;
  // subscriber: how stored names map to destinations, as in the planner (common/planner).
  std::vector<planner::RenameRule> renames;
  std::vector<planner::FusionRule> fusions = planner::DefaultFusionRules();
};

// A registered buffer as the store sees it: the tensor (name, dtype, global shape, shard) and
// host memory holding that shard densely in row-major order.
struct ShardBuffer {
  weightbeam::v1::TensorSpec spec;
  int rank = 0;  // the owner's rank (publisher: one file per trainer rank)
  absl::Span<uint8_t> data;
  uint64_t id = 0;  // stable while registered (the agent's region id)
  int replica = 0;  // the owner's inference replica
};

struct PublishResult {
  uint64_t version = 0;
  bool anchor = false;
  uint64_t base_version = 0;      // 0 for an anchor
  uint64_t bytes_written = 0;     // all files of this version, manifest included
  uint64_t dense_bytes = 0;       // the source bytes (what an anchor stores)
  uint64_t changed_elements = 0;  // in delta-encoded tensors
  std::vector<std::string> files;
};

class DeltaPublisher {
 public:
  explicit DeltaPublisher(StoreOptions options);

  // Picks up where an earlier run of this writer left off: versions must stay newer than the
  // newest manifest of this writer in the directory (the next one is an anchor anyway).
  absl::Status Resume();

  // Writes version `version` of `sources` (must be newer than the last published one). An
  // anchor when it is the first, `anchor_every` versions after the last anchor, after a failed
  // publish, or when the set of sources changed; else sparse deltas against the host shadow.
  absl::StatusOr<PublishResult> Publish(uint64_t version, const std::vector<ShardBuffer>& sources);

 private:
  StoreOptions options_;
  std::map<uint64_t, std::vector<uint8_t>> shadows_;  // id -> bytes of the last version
  std::string source_set_;                            // what the shadows describe
  uint64_t last_version_ = 0;
  uint64_t last_anchor_ = 0;
  uint64_t previous_anchor_ = 0;
  bool force_anchor_ = true;
};

struct SubscriberHooks {
  std::function<absl::Status(uint64_t version)> begin;
  std::function<absl::Status(uint64_t version)> commit;
  // A version that was found but not applied (corrupt, truncated, wrong base...).
  std::function<void(uint64_t version, const std::string& reason)> refused;
  // A `*.json` name in the directory that is not a manifest name ("<name>: <why>"), once.
  std::function<void(const std::string& what)> ignored;
};

struct PollResult {
  std::vector<uint64_t> committed;
  std::vector<std::pair<uint64_t, std::string>> refused;
  std::vector<std::string> ignored;  // reported for the first time by this poll
};

class DeltaSubscriber {
 public:
  explicit DeltaSubscriber(StoreOptions options);

  // Applies every complete version that follows the held one, in order. A delta whose base is
  // not the held version is refused and the subscriber seeks the newest anchor after it; so it
  // does when it holds nothing yet. A destination registered later is first brought to the
  // held version quietly (newest anchor up to it, then its deltas, still in the directory).
  // Files are read and checked completely before the first byte is written.
  PollResult Poll(const std::vector<ShardBuffer>& destinations, const SubscriberHooks& hooks);

  uint64_t held_version() const { return held_; }

 private:
  // Reads, checks and applies version `v` (an anchor, or deltas on version `base`).
  absl::Status Apply(uint64_t v, uint64_t base, const std::vector<ShardBuffer>& destinations,
                     const SubscriberHooks& hooks);

  StoreOptions options_;
  planner::RenameRules renames_;
  uint64_t held_ = 0;
  uint64_t skip_through_ = 0;  // refused versions are not retried
  bool need_anchor_ = true;
  std::set<uint64_t> applied_ids_;  // destinations that hold version `held_`
  // Ignored names and unusable manifests already reported (each is said once, while present).
  std::set<std::string> reported_;
  // FP8 destinations: the BF16 values they were quantised from (deltas apply here).
  std::map<uint64_t, std::vector<uint8_t>> fp8_shadows_;
};

// File names of the layout above.
std::string VersionPrefix(uint64_t version);
std::string ManifestName(uint64_t version, const std::string& writer);

}  // namespace wb::storage
