// The planner's input: what each agent holds (tensors, shards, regions, NIC rails), as plain
// structs with no I/O. The controller fills these from the agents' reported layouts
// (plan_proto.h converts); tests and benchmarks build them directly (models.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/planner/small_vec.h"
#include "common/planner/tensor_name.h"
#include "common/tensor/box.h"
#include "common/tensor/dtype.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::planner {

using DType = weightbeam::v1::DType;
using Transform = weightbeam::v1::Transform;

// The most dimensions a tensor may have (common/tensor/box.h).
using tensor::kMaxDims;
// FP8 block scaling works on 128x128 blocks (DeepSeek-V3 layout).
inline constexpr int64_t kFp8Block = 128;

enum class Role : uint8_t { kTrainer, kInference };

// This buffer holds global[start, start + size) along one dimension.
struct DimSlice {
  int64_t start = 0;
  int64_t size = 0;
};

// Trainer rank `rank` (of data-parallel replica `replica`), or rank `rank` of inference
// replica `replica`.
struct Owner {
  Role role = Role::kTrainer;
  int32_t rank = 0;
  int32_t replica = 0;
};

// A shard that is a box inside a larger buffer (one engine parameter filled by several parts).
// The region holds the whole buffer of `shape`, row-major; the shard's k dims map onto the
// buffer's last k dims and shard element [0..0] sits at `offset` (one entry per buffer dim).
// Few entries have one (engine layouts): an empty view takes 40 bytes and no allocation.
struct BufferView {
  SmallVec<int64_t, 1> shape;  // empty: no view
  SmallVec<int64_t, 1> offset;
  TensorName buffer;  // the engine parameter's name

  bool empty() const { return shape.empty(); }
};

// An entry's global shape and shard, one element per dimension (inline up to 2).
using EntryShape = SmallVec<int64_t, 2>;
using EntryShard = SmallVec<DimSlice, 2>;

// One registered tensor buffer. `shard` empty means the full tensor; otherwise one slice per
// dimension, held densely in row-major order at offset 0 of region `region`, or, with a
// `view`, as a box inside the region's buffer. Compact, because Kimi-K2 layouts hold 14 M of
// these: the name is interned, and shape and shard of up to 2 dimensions (every weight of the
// supported models) are held inline, so an entry without a view allocates nothing.
struct TensorEntry {
  TensorName name;
  EntryShape shape;
  EntryShard shard;
  BufferView view;
  Owner owner;
  DType dtype = weightbeam::v1::DTYPE_UNSPECIFIED;
  uint64_t region = 0;
  uint64_t region_bytes = 0;
  int32_t gpu = -1;  // -1: host memory; else the GPU index on the agent ("cuda:N")
};
static_assert(sizeof(TensorEntry) <= 152, "TensorEntry is per registered tensor: keep it small");

struct Nic {
  std::string name;
  double gbps = 0;  // nominal GB/s; 0: use the cost model's default
};

// An agent that repeats another's layout for other inference replicas (a replica mirror): it
// holds exactly the entries of `agents[of]`, in the same order and with the same names, shapes,
// shards, views, dtypes, GPUs and region sizes, but for replica `owner.replica + replica_delta`
// and in its own regions. Inference replicas of one deployment are laid out alike, so a
// 16-replica Kimi-K2 fleet is one replica's entries plus 15 mirrors instead of 14 M entries.
struct Mirror {
  int32_t of = -1;  // index of the template agent in the same vector; -1: not a mirror
  int32_t replica_delta = 0;
  // Entry i's region id on this agent; empty: the template's ids.
  std::vector<uint64_t> regions;
};

struct AgentLayout {
  std::string name;
  std::vector<Nic> nics;
  std::vector<TensorEntry> tensors;  // empty on a mirror: its entries are the template's
  Mirror mirror;

  bool IsMirror() const { return mirror.of >= 0; }
};

// Agent `a`'s entries, mirrors included. These readers and UnfoldMirrors expect valid mirrors
// (MirrorProblem empty, as BuildPlan checks first): a template in range, not itself a mirror.
inline const AgentLayout& EntryHolder(const std::vector<AgentLayout>& agents, int32_t a) {
  return agents[a].IsMirror() ? agents[agents[a].mirror.of] : agents[a];
}
inline size_t EntryCount(const std::vector<AgentLayout>& agents, int32_t a) {
  return EntryHolder(agents, a).tensors.size();
}
// Entry t of agent a as the agent holds it: a mirror's replica and region applied.
TensorEntry ResolvedEntry(const std::vector<AgentLayout>& agents, int32_t a, int32_t t);
uint64_t EntryRegion(const std::vector<AgentLayout>& agents, int32_t a, int32_t t);

// What makes the mirrors of `agents` unusable (one line), or "" when they are fine: a mirror of
// a mirror or of itself, a template holding trainer entries, a region list of the wrong size,
// a replica held by mirrors that do not repeat the unshifted replica's agents exactly.
std::string MirrorProblem(const std::vector<AgentLayout>& agents);

// Synthetic deployments (plan_bench, `wbctl plan --dry-run`) refuse more GPUs per side than
// this, and config.json layouts more entries than kMaxLayoutEntries (~20 GB of entries) or
// than the machine's memory takes, with an error instead of running out of memory.
inline constexpr int kMaxDeploymentGpus = 1 << 20;
inline constexpr uint64_t kMaxLayoutEntries = uint64_t{1} << 27;
// InvalidArgument naming the limit when either side has more than kMaxDeploymentGpus GPUs.
absl::Status CheckDeploymentGpus(int trainer_gpus, int inference_gpus);

// Every mirror replaced by the full list of its entries (same agent and entry indices).
std::vector<AgentLayout> UnfoldMirrors(const std::vector<AgentLayout>& agents);

// Turns each inference agent whose entries repeat an earlier agent's, entry for entry, up to
// region ids and a constant replica shift, into a mirror of it, when every replica it holds is
// then held only by mirrors of one shift whose templates hold the unshifted replica (what the
// planner accepts). Plans of the folded and the unfolded layouts are the same, hash for hash.
// Returns the number of agents folded.
int FoldMirrors(std::vector<AgentLayout>* agents);

// Bytes per element and "bf16"-style names: common/tensor/dtype.h.
using tensor::DTypeBytes;
using tensor::DTypeName;
// "[2048, 1024]"
std::string FormatShape(absl::Span<const int64_t> shape);
// "[0:128, 0:1024]" (start:end per dimension); the full tensor when `shard` is empty.
std::string FormatSlice(absl::Span<const DimSlice> shard, absl::Span<const int64_t> shape);
// "trainer rank 3 on agent trainer-000", "inference replica 1 rank 2 on agent infer-003"
std::string FormatOwner(const Owner& owner, const std::string& agent);
// "host" or "cuda:N" <-> -1 / N. Returns false for anything else.
bool ParseLocation(const std::string& location, int32_t* gpu);
std::string FormatLocation(int32_t gpu);

}  // namespace wb::planner
