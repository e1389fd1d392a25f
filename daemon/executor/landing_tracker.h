// What has landed in this agent's destination memory during the open step, as merged address
// ranges: a relay (common/planner/relay.h) forwards a run of destination bytes to the next
// replica as soon as every byte of it is in, not after the whole step. Fed by the transports'
// landing callbacks (tcp, local); read by the executor's relay ops.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace wb::executor {

class LandingTracker {
 public:
  // Forgets every range and accepts landings of `step` only (BeginStep).
  void Open(uint64_t step);
  // A write of `step` landed [addr, addr + length). Landings of any other step are ignored
  // (the fence refused them, or they belong to a step already given up).
  void Landed(uint64_t step, const void* addr, uint64_t length);
  // Every byte of the open step `step` is final here (delta mode: the step's deltas were applied
  // at a prepare-commit), so whatever a relay op asks for is there (docs/concepts.md).
  void LandAll(uint64_t step);
  // Whether every byte of [addr, addr + length) has landed in `step`.
  bool Covered(uint64_t step, const void* addr, uint64_t length) const;
  // The merged ranges that grew since the last call (each as it is now), for a relay that
  // indexes its waiting ops by address instead of asking Covered for every one on every
  // landing. False when it cannot tell (more than kMaxTouched landings since the last call, or
  // LandAll): look at every waiting op then. Landings of another step are never listed.
  static constexpr size_t kMaxTouched = 4096;
  struct Range {
    uintptr_t begin = 0, end = 0;
  };
  bool TakeTouched(uint64_t step, std::vector<Range>* ranges) const;
  // Landings accepted since Open (a counter that only grows within a step).
  uint64_t changes() const;
  // Waits until changes() differs from `seen` or `until` passes; returns changes().
  uint64_t WaitChange(uint64_t seen, std::chrono::steady_clock::time_point until) const;
  // A peer's incoming connections all ended during the open step (it died, or gave the step
  // up): bytes still awaited may never land. The first such peer since Open, or "".
  void PeerEnded(const std::string& peer);
  std::string ended_peer() const;
  // The first peer among `feeders` whose connections ended in the open step (any peer when
  // `feeders` is empty), or "": a relay fed afresh after its parent died waits only on its new
  // feeders.
  std::string EndedAmong(const std::set<std::string>& feeders) const;

 private:
  // The open step, readable without the lock: every write an agent receives calls Landed, and
  // on agents that do not relay (step 0) it must cost no more than this load.
  std::atomic<uint64_t> open_step_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  uint64_t step_ = 0;
  uint64_t changes_ = 0;
  std::map<uintptr_t, uintptr_t> ranges_;   // begin -> end, disjoint and not touching
  bool all_landed_ = false;                 // LandAll for step_
  mutable std::vector<uintptr_t> touched_;  // a byte of each range that grew since TakeTouched
  mutable bool touched_overflow_ = false;   // more than kMaxTouched: TakeTouched says "all"
  std::string ended_peer_;
  std::set<std::string> ended_peers_;  // every peer that ended in the open step
};

}  // namespace wb::executor
