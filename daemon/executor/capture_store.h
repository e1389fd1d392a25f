// Capture (docs/clients.md, "Steps that do not hold the trainer"): a sending agent copies the
// bytes its ops read from the live trainer tensors into capture memory of its own (host memory
// for host sources, device memory of the same device for CUDA sources), and a later Execute
// sends from that copy, so the trainer may change its weights once every sender has captured.
// Relay ops read this agent's own destination bytes: they are never captured.
//
// Slots: the capture memory budget (agent config capture.max_bytes) holds one or two captures.
// A slot is never captured into while it is being sent from or while it holds a capture not yet
// sent; a capture that was sent stays until the slot is captured into again (a step that runs
// its senders again after a receiver dropped out sends it once more), an abort of its version
// discards it, and a new plan discards them all.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/registry/region_registry.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::executor {

class CaptureMemory;  // one slot's capture memory on one device (or the host)

// Where a step's captured ops read their sources: per byte range of a source region that the
// plan's ops read, a stand-in tensor over the captured bytes, addressed with the region's own
// offsets (only the captured ranges may be read through it). Ops it has nothing for read the
// live registration.
class CapturedSources {
 public:
  // The stand-in for `op`'s source, or null when the op reads in place (a relay op).
  std::shared_ptr<const registry::RegisteredTensor> For(const weightbeam::v1::TransferOp& op) const;

 private:
  friend class CaptureStore;
  struct Piece {
    uint64_t offset = 0;  // where the range starts in the region
    uint64_t length = 0;
    std::shared_ptr<const registry::RegisteredTensor> stand_in;
  };
  std::map<uint64_t, std::vector<Piece>> regions_;  // region -> its ranges, sorted
};

// One capture's size: the ranges of each source region the plan's captured ops read (ops'
// source spans, overlapping and touching ones merged).
struct CaptureLayout {
  struct Range {
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  std::map<uint64_t, std::vector<Range>> regions;
  uint64_t bytes = 0;

  // Fails for an op whose sizes are out of range (op_bounds.h), naming it.
  static absl::StatusOr<CaptureLayout> ForOps(
      const google::protobuf::RepeatedPtrField<weightbeam::v1::TransferOp>& ops);
};

class CaptureStore {
 public:
  // Host copies run on up to `threads` threads (a capture is a memory-bandwidth-bound copy the
  // trainer waits for: one thread does not saturate memory).
  explicit CaptureStore(registry::RegionRegistry* registry, int threads = 4)
      : registry_(registry), threads_(threads) {}

  // A new plan: discards every capture, sizes one capture of `ops` and decides the slots for a
  // budget of `max_bytes` (0: capture off, no slots): 2 when two captures fit, else 1, each
  // slot's memory taken (and paged in) now, while the plan loads, not in a step. A plan
  // whose capture does not fit is refused, naming the bytes needed and the budget (`who`
  // names the plan and agent). Returns the bytes of one capture.
  absl::StatusOr<uint64_t> Load(
      const google::protobuf::RepeatedPtrField<weightbeam::v1::TransferOp>& ops, uint64_t max_bytes,
      const std::string& who);
  uint32_t slots() const;

  // Copies what the plan's ops read into `slot`, for `version`; adds the time and bytes to
  // `report`. Refused while the slot is being sent from or holds a capture not yet sent.
  absl::Status Capture(uint64_t version, uint32_t slot, weightbeam::v1::AgentStepReport* report);
  // The capture of `version` in `slot`, which is being sent from until EndSend.
  absl::StatusOr<std::shared_ptr<const CapturedSources>> BeginSend(uint64_t version, uint32_t slot);
  // The send from `slot` is over: the slot may be captured into again.
  void EndSend(uint32_t slot);
  // The captures of `version` that are not being sent from are dropped (the step was aborted).
  void Discard(uint64_t version);

 private:
  enum class State { kEmpty, kCapturing, kCaptured, kSending, kSent };
  // Capture memory per device (-1: host), one buffer each, kept for the slot's next capture.
  using SlotMemory = std::map<int, std::shared_ptr<CaptureMemory>>;
  struct Slot {
    State state = State::kEmpty;
    uint64_t version = 0;
    std::shared_ptr<const CapturedSources> sources;
    std::shared_ptr<SlotMemory> memory = std::make_shared<SlotMemory>();
  };
  // Gives every device (-1: host) the slot's buffer for `need` bytes, the last one again where
  // only the slot still holds it. New host memory is paged in at once (on `threads_` threads),
  // so no capture pays for first touches.
  absl::Status EnsureMemory(const std::map<int, uint64_t>& need, SlotMemory* memory) const;
  // The bytes each device (-1: host) needs for `layout`, and the live tensors, checked.
  absl::Status Need(const CaptureLayout& layout,
                    std::map<uint64_t, std::shared_ptr<const registry::RegisteredTensor>>* live,
                    std::map<int, uint64_t>* need) const;
  // The copy itself, without the lock, into `memory` (reused where no one else holds it).
  absl::StatusOr<std::shared_ptr<const CapturedSources>> Copy(const CaptureLayout& layout,
                                                              SlotMemory* memory) const;
  static std::string Describe(const Slot& s);

  registry::RegionRegistry* const registry_;
  const int threads_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const CaptureLayout> layout_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by Load: captures of older plans go
};

}  // namespace wb::executor
