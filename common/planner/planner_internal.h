// Internal to the planner: the state of one BuildPlan call, shared by its steps (index,
// validate, match, generate, schedule), each in its own file. Not part of the public API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/planner/plan.h"
#include "common/planner/problems.h"
#include "common/planner/reshard.h"

namespace wb::planner::internal {

struct EntryRef {
  int32_t agent;
  int32_t tensor;
};

// A distinct slice of a source tensor and the entries (replicas) holding exactly it.
struct Slice {
  int64_t start0;
  int64_t size0;
  int64_t start1;  // dimension 1 when ndim == 2, so 1-D and 2-D slices need no entry lookup
  int64_t size1;
  int32_t ndim;
  int32_t holder_begin;
  int32_t holder_count;
};

struct Part {
  int32_t src_name;
  int64_t offset;  // along the fusion dimension, in the destination
};

// Destination entries of one name that are planned together: the leader's geometry, and the
// fan-out group listing every member (-1 when the leader is alone).
struct DstClass {
  EntryRef leader;
  int32_t scale_tensor;  // the leader's FP8 scale tensor, else -1
  int32_t fanout;
};

// One name's entries on one side: a range of the planner's flat list for that side, where
// IndexEntries lays out each name's entries together (in agent, then tensor order).
class EntryRefs {
 public:
  EntryRefs() = default;
  EntryRefs(uint64_t offset, uint64_t count) : offset_(offset), count_(count) {}
  // Points the range into the list once it is allocated.
  void Bind(EntryRef* list) { data_ = list + offset_; }
  EntryRef* begin() const { return data_; }
  EntryRef* end() const { return data_ + count_; }
  EntryRef* data() const { return data_; }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  EntryRef& operator[](size_t i) const { return data_[i]; }

 private:
  EntryRef* data_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t count_ = 0;
};

struct NameInfo {
  EntryRefs src;
  EntryRefs dst;
  bool bad = false;
  // Sources: distinct slices sorted by start along dim 0.
  int32_t slice_begin = 0;
  int32_t slice_count = 0;
  int64_t max_len0 = 0;
  // Destinations.
  bool derived_scale = false;  // an FP8 scale tensor written by its weight's ops
  bool fp8_error_reported = false;
  int32_t fusion_dim = 0;
  std::vector<Part> parts;
  Transform transform = weightbeam::v1::TRANSFORM_UNSPECIFIED;
  int32_t scale_name = -1;
  int32_t phase = 0;
  std::vector<DstClass> classes;  // set by GroupDestinations, in info.dst order of leaders
};

// An op whose source range several holders (replicas) have; chosen when balancing.
struct PendingChoice {
  PlannedOp op;
  int32_t slice;
};

// One thread's share of the per-name checks: names [begin, end) of infos_, their problems, and
// where their source slices and holders go next in the plan-wide lists (each shard has the
// room its names' source entries could need, so no shard waits for another).
struct CheckShard {
  size_t begin = 0, end = 0;
  int32_t next_slice = 0;
  int32_t next_holder = 0;
  Problems problems;
  std::vector<std::pair<Box, EntryRef>> boxes, distinct;  // scratch
};

// One thread's share of generation: destination names dst_names_[begin, end), grouped and
// generated into its own fan-out groups (numbered from 0), ops, choices and problems.
struct GenShard {
  int32_t index = 0;
  size_t begin = 0, end = 0;
  std::vector<uint32_t> fanout_sizes;  // members listed per group
  std::vector<Destination> fanout_dsts;
  std::vector<uint8_t> fanout_mirrored;   // per group (Plan::fanout_mirrored)
  std::vector<uint32_t> fanout_executed;  // per group: destinations executed
  // Per sender (empty when the shard gives it nothing), per order key: the shard's op count,
  // then the position in the sender's list of its next op.
  std::vector<std::vector<uint64_t>> slot;
  std::vector<PendingChoice> pending;
  Problems problems;           // while grouping (FP8 entry checks)
  Problems generate_problems;  // while generating (FP8 blocks split by a source)
};

inline uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

inline constexpr uint64_t kPrime = 0x100000001b3ULL * 0x9e3779b1ULL + 2;  // odd multiplier

inline uint64_t HashString(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Where a source holder keeps `slice_box` (its held box in destination coordinates): dense, or
// in its view's buffer. Holders of one slice are alternatives only when placed alike.
Placement SourcePlacement(const TensorEntry& holder, const Box& slice_box);
inline bool SamePlace(const BufferView& a, const BufferView& b) {
  return a.shape == b.shape && a.offset == b.offset;
}

inline bool IsFloat(DType d) {
  return d == weightbeam::v1::DTYPE_F32 || d == weightbeam::v1::DTYPE_F16 ||
         d == weightbeam::v1::DTYPE_BF16;
}

inline int32_t LayerPhase(std::string_view name, int layers_per_phase) {
  size_t pos = name.find("layers.");
  if (pos == std::string_view::npos || layers_per_phase <= 0) return 0;
  pos += 7;
  int64_t layer = 0;
  bool digits = false;
  while (pos < name.size() && name[pos] >= '0' && name[pos] <= '9') {
    layer = layer * 10 + (name[pos++] - '0');
    digits = true;
  }
  return digits ? static_cast<int32_t>(layer / layers_per_phase) : 0;
}

inline bool Aligned(int64_t boundary, int64_t extent) {
  return boundary % kFp8Block == 0 || boundary == extent;
}

inline std::string BoxString(const Box& b) {
  std::string out = "[";
  for (int d = 0; d < b.ndim; ++d) absl::StrAppend(&out, d ? ", " : "", b.start[d], ":", b.End(d));
  return out + "]";
}

// The first block boundary `box` cuts along dimension d, or -1.
inline int64_t SplitBoundary(const Box& box, int d, int64_t extent) {
  if (!Aligned(box.start[d], extent)) return box.start[d];
  if (!Aligned(box.End(d), extent)) return box.End(d);
  return -1;
}

// Contiguous ranges [begin, end) of units covering [0, work.size()), at most `parts` of them,
// each with about the same sum of work (every range holds at least one unit).
inline std::vector<std::pair<size_t, size_t>> SplitByWork(const std::vector<uint64_t>& work,
                                                          int parts) {
  uint64_t total = 0;
  for (uint64_t w : work) total += w;
  std::vector<std::pair<size_t, size_t>> out;
  uint64_t acc = 0;
  for (size_t begin = 0; begin < work.size();) {
    const uint64_t goal = total * (out.size() + 1) / static_cast<uint64_t>(std::max(1, parts));
    size_t end = begin;
    while (end < work.size() && (acc < goal || end == begin)) acc += work[end++];
    out.emplace_back(begin, end);
    begin = end;
  }
  return out;
}

class Planner {
 public:
  Planner(const std::vector<AgentLayout>& agents, const PlanOptions& options)
      : agents_(agents), options_(options) {}

  absl::StatusOr<Plan> Build() {
    if (!IndexMirrors()) return problems_.ToStatus();
    OrderAgents();
    IndexEntries();
    CheckBuffers();
    CheckNames();
    ApplyRenames();
    ResolveRecipes();
    Generate();
    if (!problems_.empty()) return problems_.ToStatus();
    BuildDevices();
    ChooseSources();
    OrderOps();
    Finish();
    PlanRelays();
    return std::move(plan_);
  }

 private:
  // Entry r as its template holds it (a mirror's entries are its template's); Replica(r) and
  // Who(r) apply a mirror's replica shift.
  const TensorEntry& E(EntryRef r) const { return holder_[r.agent]->tensors[r.tensor]; }
  const TensorEntry& E(int32_t agent, int32_t tensor) const {
    return holder_[agent]->tensors[tensor];
  }
  int32_t Replica(EntryRef r) const { return E(r).owner.replica + delta_[r.agent]; }
  std::string Who(EntryRef r) const {
    Owner o = E(r).owner;
    o.replica += delta_[r.agent];
    return FormatOwner(o, agents_[r.agent].name);
  }
  bool IsMirror(int32_t agent) const { return agents_[agent].IsMirror(); }
  // Threads for the sharded steps: PlanOptions::threads, else the machine's cores; 1 to 8.
  int Threads() const {
    const int n = options_.threads > 0 ? options_.threads
                                       : static_cast<int>(std::thread::hardware_concurrency());
    return std::max(1, std::min(n, 8));
  }
  int32_t HolderIndex(int32_t agent) const {
    return IsMirror(agent) ? agents_[agent].mirror.of : agent;
  }

  // Checks the replica mirrors (layout.h) and sets holder_ / delta_ / mirrors_; false when
  // they are unusable (the problem recorded).
  bool IndexMirrors();
  absl::string_view Name(int32_t id) const {
    return absl::string_view(names_[id].data(), names_[id].size());
  }

  void OrderAgents();

  // Per-entry checks, then the name index (sources = trainer role, destinations = inference).
  void IndexEntries();

  // False (with the problem recorded) when the entry is unusable; else its element count.
  bool CheckEntry(Problems* out, EntryRef ref, int64_t* volume);

  // Parts of one buffer (destination entries with a view of the same buffer name, agent and
  // owner) agree on its dtype and shape and never overlap; uncovered elements are allowed.
  void CheckBuffers();
  // Per buffer name id, its position in string order among the parts' buffer names.
  std::vector<uint32_t> BufferNameOrder(const std::vector<EntryRef>& parts) const;
  // Sorts one agent's parts by replica, rank, buffer name (`order`) and offset.
  void SortByBuffer(std::vector<EntryRef>* parts, const std::vector<uint32_t>& order) const;
  // CheckBuffers on one agent's sorted parts.
  void CheckBufferParts(Problems* out, const std::vector<EntryRef>& parts) const;

  // Every entry of a name on one side agrees on dtype and global shape.
  bool CheckConsistent(Problems* out, int32_t name, const EntryRefs& refs);

  // `boxes` sorted and distinct: report partial overlaps and holes. `side` says whose shards.
  // replica < 0: the trainers' shards; else those of that inference replica.
  bool CheckTiling(Problems* out, int32_t name, int32_t replica,
                   const std::vector<std::pair<Box, EntryRef>>& boxes);

  void SortedBoxes(const EntryRef* begin, const EntryRef* end,
                   std::vector<std::pair<Box, EntryRef>>* boxes);

  bool HolderLess(EntryRef a, EntryRef b) const;
  // The canonical order of destination entries: replica, rank, then HolderLess.
  bool DstLess(EntryRef a, EntryRef b) const;

  // Sources: identical slices are alternatives (replicas); distinct slices must tile exactly.
  void CheckSources(CheckShard* c, int32_t name);

  // Destinations: within each inference replica, distinct slices tile exactly (identical
  // slices on several ranks are replicated copies, each written).
  void CheckDestinations(CheckShard* c, int32_t name);

  // CheckSources and CheckDestinations of every name, sharded over the threads.
  void CheckNames();

  // canonical (destination-space) name -> source name id.
  void ApplyRenames();

  int32_t FindSource(const std::string& dst_name) const;

  // The name id of `name` in this call, or -1 when no entry has that name.
  int32_t NameId(absl::string_view name) const;

  std::string SrcWho(int32_t src_name) const;

  void ResolveRecipes();

  void Resolve(Problems* out, int32_t n);
  // An FP8-block destination's scale tensor: found, marked as written by the weight's ops and
  // checked (f32, one scale per 128x128 block); after every name resolved.
  void ResolveScale(Problems* out, int32_t n);

  void SetTransform(Problems* out, int32_t n, DType src);

  // The scale entry beside an FP8 destination entry: same agent and owner. `hint`: where in
  // the scale name's (sorted) entries to look first.
  int32_t FindScaleEntry(int32_t scale_name, EntryRef w, size_t hint) const;

  void ReportFp8(Problems* out, int32_t n, const std::string& msg);

  // Checks one FP8 destination entry and its scale entry; false when unusable.
  // `position`: the entry's index in the name's sorted destination entries.
  bool CheckFp8Entry(Problems* out, int32_t n, EntryRef ref, const Box& dbox, int32_t* scale_tensor,
                     size_t position);
  // The view rules of an FP8 part: it cuts no 128x128 block of its buffer, and its scale part
  // sits at the matching blocks of the scale buffer.
  bool CheckFp8View(Problems* out, int32_t n, EntryRef ref, const Box& dbox, EntryRef scale);

  // The slice's box, shifted by `offset` along the fusion dim `fdim`.
  void SliceBox(const Slice& slice, int fdim, int64_t offset, Box* out) const;
  size_t OrderKey(int32_t src_agent, int32_t dst_agent, int32_t phase) const;
  // phases_ from the destinations' layers; one (empty) op list per agent.
  void CountPhases();

  // Checks every FP8 destination entry and groups each name's destination entries into
  // classes of identical geometry (one class per entry unless options_.fan_out).
  void GroupDestinations(GenShard* g);
  // The source's element size when name n's tensor-parallel siblings can share ops (2-D, every
  // source slice holds whole rows and has one holder, no fusion along columns), else 0.
  int64_t SiblingElemBytes(int32_t n) const;

  // Counts the shard's single-holder ops per sender and order key into g->slot.
  void CountShard(GenShard* g, size_t nkeys);

  // Ops of the shard's destination classes: single-holder ops at their positions in the
  // senders' lists (g->slot), the rest into its pending choices.
  void GenerateShard(GenShard* g);

  // Shards the destination names over the threads, groups, counts and generates them; the
  // plan is the one a single pass in name order gives.
  void Generate();

  // Devices: one per (agent, GPU) plus one per agent for host memory. Per tensor: its device
  // and a hash of its identity, in dense arrays so the passes over ops stay cache friendly.
  void BuildDevices();

  double RailGbps(int32_t agent, int rail) const;

  // The device of entry `tensor` of `agent` (a mirror's: its template's, on its own devices).
  int32_t Dev(int32_t agent, int32_t tensor) const {
    if (!IsMirror(agent)) return tensor_dev_[agent][tensor];
    const int32_t of = HolderIndex(agent);
    return tensor_dev_[of][tensor] - dev_base_[of] + dev_base_[agent];
  }

  // How many destinations an op is executed for (1 unless it fans out).
  uint32_t Fanout(const PlannedOp& op) const {
    return op.fanout < 0 ? 1 : plan_.fanout_size[op.fanout];
  }

  // Bytes-equivalent cost of an op on a sender (the per-op overhead at the NIC's rate), for
  // each destination it is executed for.
  double OpCost(const PlannedOp& op) const;

  // Greedy, largest first: each multi-holder op goes to its least loaded source device.
  void ChooseSources();
  // Splits pending fan-out ops that alone outweigh a fraction of a source device's fair share
  // into several ops over disjoint destinations (ChooseSources then gives each its holder).
  void SplitHeavyFanouts(const std::vector<double>& fixed_load);

  // Per sender, stable by (phase, destination agent rotated by the sender's position) so that
  // senders start on different receivers instead of all hitting the first one.
  void OrderOps();

  static double Imbalance(const std::vector<uint64_t>& v);

  // One pass over the ordered ops: rails (least loaded of the source device's rails, in
  // execution order), statistics, and the hash (over names, owners, regions and op fields,
  // never over input positions).
  void Finish();

  // PlanOptions::relays: the relay tree (relay.h) that lowers the predicted step most, or none;
  // the statistics then describe the plan with relays. Fills Plan::relay's predictions always.
  void PlanRelays();

  const std::vector<AgentLayout>& agents_;
  const PlanOptions& options_;
  std::vector<const AgentLayout*> holder_;     // per agent: whose `tensors` hold its entries
  std::vector<int32_t> delta_;                 // per agent: its replica shift (0 unless mirror)
  std::vector<std::vector<int32_t>> mirrors_;  // per template agent: its mirrors, by index
  Problems problems_;
  Plan plan_;
  std::vector<int32_t> agent_rank_;
  // Interned name (TensorName::id, dense) -> name id of this call, -1 when no entry has it.
  std::vector<int32_t> name_ids_;
  std::vector<std::string_view> names_;
  std::vector<NameInfo> infos_;
  std::vector<EntryRef> src_refs_, dst_refs_;  // every name's entries, name by name
  // Usable destination entries with a buffer view, in agent then tensor order (CheckBuffers).
  std::vector<EntryRef> view_entries_;
  std::vector<std::vector<int32_t>> tensor_name_;
  // Source slices and their holders, name by name; a name's slices and holders are found from
  // its slice_begin (the lists may have unused room between the check shards' parts).
  std::unique_ptr<Slice[]> slices_;
  std::unique_ptr<EntryRef[]> holders_;
  std::unordered_map<std::string, int32_t> canonical_;
  std::vector<int32_t> dst_names_;
  std::vector<char> checked_bad_;  // infos_[n].bad after the checks, read while resolving
  std::vector<PendingChoice> pending_;
  int32_t phases_ = 1;
  std::vector<char> needs_order_;  // senders that got ops appended when balancing
  std::vector<int32_t> dev_base_;
  std::vector<std::vector<int32_t>> tensor_dev_;
  std::vector<int32_t> dev_rail_first_, dev_rail_step_, dev_rail_count_;
  std::vector<int32_t> rail_base_;
  // Per agent: CostModel::agent_rate_scale (1 when not measured slow).
  std::vector<double> rate_scale_;
  // Per rail (rail_base_): bytes received, and the slowest rail's receiving time, from Finish
  // (read by PlanRelays).
  std::vector<double> recv_rail_;
  double recv_limit_seconds_ = 0;
};

}  // namespace wb::planner::internal
