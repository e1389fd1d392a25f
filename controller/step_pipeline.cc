#include "controller/step_pipeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace wb::controller {

namespace {
// `deadline` on absl's clock, for waits on an absl::Mutex.
absl::Time AbslDeadline(StepPipeline::Clock::time_point deadline) {
  return absl::Now() + absl::FromChrono(deadline - StepPipeline::Clock::now());
}
}  // namespace

absl::StatusOr<std::unique_ptr<StepPipeline::Ticket>> StepPipeline::Enter(
    uint64_t version, Clock::time_point deadline) {
  std::unique_ptr<Ticket> t(new Ticket(this, version));
  {
    absl::MutexLock lock(&mu_);
    auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !capture_token_; };
    const uint64_t freed_before = freed_by_;
    const bool busy = capture_token_;
    if (!mu_.AwaitWithDeadline(absl::Condition(&free), AbslDeadline(deadline))) {
      return absl::DeadlineExceededError(
          "waited until the step deadline for the step before it to capture");
    }
    if (busy && freed_by_ != freed_before) t->waited_for_send_ = freed_by_;
    capture_token_ = true;
    t->token_ = true;
  }
  // The send lock now, or behind a capture step that is sending.
  t->send_lock_held_ = send_lock_->TryLock();
  bool behind = false;
  if (!t->send_lock_held_) {
    absl::MutexLock lock(&mu_);
    if (send_open_) {
      behind = true;
      t->behind_ = send_target_;
      t->ahead_ = send_version_;
    }
  }
  if (!t->send_lock_held_ && !behind) t->send_lock_held_ = send_lock_->TryLock();  // let go?
  if (!t->send_lock_held_ && !behind) {
    return absl::FailedPreconditionError(
        "another step or plan is in progress; steps run one at a time");
  }
  return t;
}

int StepPipeline::waiting_to_send() const {
  absl::MutexLock lock(&mu_);
  return waiting_to_send_;
}

void StepPipeline::Ticket::ReleaseToken() {
  if (!token_) return;
  absl::MutexLock lock(&pipeline_->mu_);
  pipeline_->capture_token_ = false;
  token_ = false;
}

absl::StatusOr<uint32_t> StepPipeline::Ticket::TakeSlot(const CaptureTarget& target,
                                                        Clock::time_point deadline,
                                                        uint64_t* after_send) {
  StepPipeline* p = pipeline_;
  absl::MutexLock lock(&p->mu_);
  if (!send_lock_held_ && !waiting_) {
    ++p->waiting_to_send_;
    waiting_ = true;
  }
  auto slot_free = [p, &target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
    return p->busy_slots_.size() < target.slots;
  };
  const bool waited = !slot_free();
  if (!p->mu_.AwaitWithDeadline(absl::Condition(&slot_free), AbslDeadline(deadline))) {
    return absl::DeadlineExceededError(
        absl::StrCat("waited until the step deadline for the send of version ", p->send_version_,
                     " to free a capture slot"));
  }
  uint32_t slot = 0;
  while (p->busy_slots_.count(slot)) ++slot;
  p->busy_slots_.insert(slot);
  slot_ = static_cast<int>(slot);
  *after_send = waited ? p->freed_by_ : 0;
  return slot;
}

absl::Status StepPipeline::Ticket::AwaitSendLock(Clock::time_point deadline) {
  // Not LockWhenWithDeadline: it waits for the mutex itself past any deadline. The lock is
  // tried each time a send ends (and every 10 ms, for a plan holding it).
  StepPipeline* p = pipeline_;
  while (!send_lock_held_) {
    send_lock_held_ = p->send_lock_->TryLock();
    if (send_lock_held_) break;
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "captured, then waited until the step deadline for version ", ahead_, "'s send"));
    }
    absl::MutexLock lock(&p->mu_);
    const uint64_t seen = p->sends_ended_;
    auto ended = [p, seen]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->sends_ended_ != seen; };
    p->mu_.AwaitWithDeadline(
        absl::Condition(&ended),
        std::min(AbslDeadline(deadline), absl::Now() + absl::Milliseconds(10)));
  }
  StopWaiting();
  return absl::OkStatus();
}

void StepPipeline::Ticket::OpenSend(const CaptureTarget& target) {
  {
    absl::MutexLock lock(&pipeline_->mu_);
    pipeline_->send_open_ = true;
    pipeline_->send_version_ = version_;
    pipeline_->send_target_ = target;
    open_ = true;
  }
  ReleaseToken();
}

void StepPipeline::Ticket::ReleaseSlot() {
  if (slot_ < 0) return;
  absl::MutexLock lock(&pipeline_->mu_);
  pipeline_->busy_slots_.erase(static_cast<uint32_t>(slot_));
  pipeline_->freed_by_ = version_;
  slot_ = -1;
}

void StepPipeline::Ticket::StopWaiting() {
  if (!waiting_) return;
  absl::MutexLock lock(&pipeline_->mu_);
  --pipeline_->waiting_to_send_;
  waiting_ = false;
}

StepPipeline::Ticket::~Ticket() {
  ReleaseSlot();
  StopWaiting();
  if (open_) {
    absl::MutexLock lock(&pipeline_->mu_);
    pipeline_->send_open_ = false;
  }
  if (send_lock_held_) {
    pipeline_->send_lock_->Unlock();
    absl::MutexLock lock(&pipeline_->mu_);
    ++pipeline_->sends_ended_;  // a step behind this one tries the send lock now
  }
  ReleaseToken();
}

}  // namespace wb::controller
