// The order of capture steps on the controller (docs/clients.md, "Steps that do not hold the
// trainer"): a step captures, queues for the send lock, then sends. Three things decide what
// may happen next, and they live here only: the capture token (held by one step from before it
// captures until it holds the send lock, so steps send in the order they captured), the send
// lock (the controller's plan lock: one step sends, or one plan is made, at a time) and the
// capture slots (a step captures into a slot no other captured or sending step holds).
//
// A step's place is a Ticket: it gives back whatever it still holds on every way out (RAII),
// so a step failing in any phase never leaves the token, a slot or the send lock behind.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace wb::controller {

// What a capture step captures on: the plan, its senders (not the relay-only ones), and how
// many capture slots they all have.
struct CaptureTarget {
  uint64_t plan_id = 0;
  std::vector<std::string> senders;
  uint32_t slots = 0;
};

class StepPipeline {
 public:
  using Clock = std::chrono::steady_clock;

  // `send_lock`: held for a whole send or plan (the controller's plan lock).
  explicit StepPipeline(absl::Mutex* send_lock) : send_lock_(send_lock) {}

  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

    // Whether this step holds the send lock; if not, it is behind the capture step that is
    // sending: that step's target and version.
    bool holds_send_lock() const { return send_lock_held_; }
    const CaptureTarget& behind() const { return behind_; }
    uint64_t ahead() const { return ahead_; }
    // The step whose send the token was waited for (a third step: one sends, one captured
    // waits to send), 0 when the token was free or freed by a capture.
    uint64_t waited_for_send() const { return waited_for_send_; }

    // In place (no capture): the token goes at once, and a step coming now is refused while
    // this one holds the send lock, as ever.
    void ReleaseToken();
    // The capture phase's slot: the lowest free one of `target`'s, once a send frees one (by
    // `deadline`). `*after_send`: the step whose send freed it, 0 when one was free at once.
    absl::StatusOr<uint32_t> TakeSlot(const CaptureTarget& target, Clock::time_point deadline,
                                      uint64_t* after_send);
    // Behind a send: waits (by `deadline`, which is kept) for the send lock, once that step is
    // over.
    absl::Status AwaitSendLock(Clock::time_point deadline);
    // Captured, holding the send lock: later steps may capture behind this one's send from now
    // on, and the token goes to the next.
    void OpenSend(const CaptureTarget& target);
    // The send is over: a step waiting for a slot captures now.
    void ReleaseSlot();

   private:
    friend class StepPipeline;
    Ticket(StepPipeline* pipeline, uint64_t version) : pipeline_(pipeline), version_(version) {}
    void StopWaiting();

    StepPipeline* const pipeline_;
    const uint64_t version_;
    bool token_ = false, send_lock_held_ = false, open_ = false, waiting_ = false;
    int slot_ = -1;
    CaptureTarget behind_;
    uint64_t ahead_ = 0;
    uint64_t waited_for_send_ = 0;
  };

  // A step of `version` enters: the capture token (once the step before it captured, by
  // `deadline`), then the send lock, or a place behind the capture step that is sending.
  // Refused when another step or plan holds the send lock and is not a capture step's send.
  absl::StatusOr<std::unique_ptr<Ticket>> Enter(uint64_t version, Clock::time_point deadline);
  // Captured steps waiting for the send lock (the link learner does not replan under them).
  int waiting_to_send() const;

 private:
  absl::Mutex* const send_lock_;
  mutable absl::Mutex mu_;
  bool capture_token_ ABSL_GUARDED_BY(mu_) = false;
  // The step holding the send lock is a capture step that a later one may capture behind.
  bool send_open_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t send_version_ ABSL_GUARDED_BY(mu_) = 0;
  CaptureTarget send_target_ ABSL_GUARDED_BY(mu_);
  // Slots held by steps captured or sending; the step whose send freed one last.
  std::set<uint32_t> busy_slots_ ABSL_GUARDED_BY(mu_);
  uint64_t freed_by_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_to_send_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sends_ended_ ABSL_GUARDED_BY(mu_) = 0;  // tickets that gave the send lock back
};

}  // namespace wb::controller
