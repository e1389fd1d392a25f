// Capture (docs/clients.md, "Steps that do not hold the trainer"): a sending agent copies the
// bytes its ops read from the live trainer tensors into capture memory of its own (host memory
// for host sources, device memory of the same device for CUDA sources), and a later Execute
// sends from that copy, so the trainer may change its weights once every sender has captured.
// Relay ops read this agent's own destination bytes: they are never captured.
//
// Slots: the capture memory budget (agent config capture.max_bytes) holds one or two captures.
// A slot is never captured into while it is being captured into or sent from; a capture that
// was sent stays until the slot is captured into again (a step that runs its senders again
// after a receiver dropped out sends it once more), an abort of its step discards it (a capture
// still running then stops and ends discarded), and a new plan discards them all. The
// controller decides which slot a step captures into: a slot it hands out again while the
// agent still holds an unsent capture there (its step ended without sending it and the abort
// was lost, or the controller restarted) is taken over, never wedged. A capture stops at the
// deadline it is given. The budget holds across plan loads: capture memory still held by a
// finishing send or capture counts, and an allocation past the budget is refused.
#pragma once

#include <atomic>
#include <chrono>
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
  // `test_delay` (a test hook, agent config capture.test_delay_ms): every capture waits this
  // long before copying, as a capture of tens of GB would, stopping early as a copy does.
  explicit CaptureStore(registry::RegionRegistry* registry, int threads = 4,
                        std::chrono::milliseconds test_delay = std::chrono::milliseconds(0))
      : registry_(registry), threads_(threads), test_delay_(test_delay) {}

  // A new plan: discards every capture, sizes one capture of `ops` and decides the slots for a
  // budget of `max_bytes` (0: capture off, no slots): 2 when two captures fit, else 1, each
  // slot's memory taken (and paged in) now, while the plan loads, not in a step. A plan
  // whose capture does not fit is refused, naming the bytes needed and the budget (`who`
  // names the plan and agent). Returns the bytes of one capture. Buffers of the old plan's
  // slots are kept where the new one needs the same size (no freeing and paging in again),
  // and new memory is paged in without the store's lock.
  absl::StatusOr<uint64_t> Load(
      const google::protobuf::RepeatedPtrField<weightbeam::v1::TransferOp>& ops, uint64_t max_bytes,
      const std::string& who);
  uint32_t slots() const;

  // Copies what the plan's ops read into `slot`, for `version` of step `step_id` (0: the step
  // is known by its version only), by `deadline`; adds the time and bytes to `report`. Refused
  // while the slot is being captured into or sent from; a capture not yet sent that the slot
  // still holds is replaced (the controller gave the slot out again: its step is over). Fails
  // when the step is discarded meanwhile or the deadline passes; the slot is empty then.
  absl::Status Capture(uint64_t version, uint32_t slot, weightbeam::v1::AgentStepReport* report,
                       uint64_t step_id = 0,
                       std::chrono::steady_clock::time_point deadline =
                           std::chrono::steady_clock::time_point::max());
  // The capture of `version` in `slot`, which is being sent from until EndSend.
  absl::StatusOr<std::shared_ptr<const CapturedSources>> BeginSend(uint64_t version, uint32_t slot);
  // The send from `slot` is over: the slot may be captured into again.
  void EndSend(uint32_t slot);
  // The step was aborted: its captures that are not being sent from are dropped, and one still
  // running stops and ends discarded. By step id when both sides know it, else by version (a
  // retried version's new step keeps its capture when an abort of the old one comes late).
  void Discard(uint64_t version, uint64_t step_id = 0);
  // Bytes of capture memory alive now (slots, and buffers a finishing send still holds).
  uint64_t memory_bytes() const;

 private:
  enum class State { kEmpty, kCapturing, kCaptured, kSending, kSent };
  // Capture memory per device (-1: host), one buffer each, kept for the slot's next capture.
  using SlotMemory = std::map<int, std::shared_ptr<CaptureMemory>>;
  struct Slot {
    State state = State::kEmpty;
    uint64_t version = 0;
    uint64_t step_id = 0;
    std::shared_ptr<const CapturedSources> sources;
    std::shared_ptr<SlotMemory> memory = std::make_shared<SlotMemory>();
    // Set to stop the capture running in the slot (its step was discarded, a new plan came).
    std::shared_ptr<std::atomic<bool>> stop;
  };
  // The slot holds no capture (its memory stays for the next one).
  static void Clear(Slot* s);
  // Gives every device (-1: host) the slot's buffer for `need` bytes, the last one again where
  // only the slot still holds it. New host memory is paged in at once (on `threads_` threads),
  // so no capture pays for first touches. An allocation that would bring the store's live
  // capture memory over the budget waits (until `deadline`) for a finishing send to let go of
  // an old buffer, then is refused.
  absl::Status EnsureMemory(const std::map<int, uint64_t>& need, SlotMemory* memory,
                            std::chrono::steady_clock::time_point deadline) const;
  // The bytes each device (-1: host) needs for `layout`, and the live tensors, checked.
  absl::Status Need(const CaptureLayout& layout,
                    std::map<uint64_t, std::shared_ptr<const registry::RegisteredTensor>>* live,
                    std::map<int, uint64_t>* need) const;
  // The copy itself, without the lock, into `memory` (reused where no one else holds it);
  // gives up once `stop` is set or `deadline` passes.
  absl::StatusOr<std::shared_ptr<const CapturedSources>> Copy(
      const CaptureLayout& layout, SlotMemory* memory, const std::atomic<bool>& stop,
      std::chrono::steady_clock::time_point deadline) const;
  // Live bytes of every buffer the store allocated (the budget's count).
  uint64_t LiveBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(budget_mu_);
  static std::string Describe(const Slot& s);

  registry::RegionRegistry* const registry_;
  const int threads_;
  const std::chrono::milliseconds test_delay_;
  // Every buffer taken, for the budget: a send or capture finishing on the old plan's memory
  // still counts after a new plan loaded.
  mutable absl::Mutex budget_mu_;
  mutable std::vector<std::weak_ptr<CaptureMemory>> allocated_ ABSL_GUARDED_BY(budget_mu_);
  uint64_t max_bytes_ ABSL_GUARDED_BY(budget_mu_) = 0;
  mutable absl::Mutex mu_;
  std::shared_ptr<const CaptureLayout> layout_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by Load: captures of older plans go
};

}  // namespace wb::executor
