#include "daemon/transport/step_fence.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace wb::transport {
namespace {
// Refusal counts and log marks kept per step: enough for the current and recent steps.
constexpr size_t kRememberedSteps = 64;
constexpr size_t kRememberedLogMarks = 1024;
}  // namespace

StepFence::Pass& StepFence::Pass::operator=(Pass&& other) noexcept {
  if (this != &other) {
    Release();
    fence_ = std::exchange(other.fence_, nullptr);
  }
  return *this;
}

void StepFence::Pass::Release() {
  if (fence_ != nullptr) std::exchange(fence_, nullptr)->Leave();
}

StepFence::StepFence(std::string transport) : transport_(std::move(transport)) {}

absl::Status StepFence::Admit(uint64_t step, const std::string& peer, Pass* pass) {
  FenceCallback callback;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!armed_ || (open_ && step == step_)) {
      ++in_flight_;
      *pass = Pass(this);
      return absl::OkStatus();
    }
    why = open_ ? absl::StrCat("write of step ", step, " refused: this receiver accepts step ",
                               step_, " only (an aborted or timed-out step's late write)")
                : absl::StrCat("write of step ", step,
                               " refused: no step is open on this receiver (aborted, committed "
                               "or not begun)");
    ++refused_[step];
    while (refused_.size() > kRememberedSteps) refused_.erase(refused_.begin());
    if (logged_.size() > kRememberedLogMarks) logged_.clear();
    if (logged_.insert({peer, step}).second) {
      spdlog::warn(
          "{} transport: {} from '{}' (further refusals of this step from it are only "
          "counted)",
          transport_, why, peer);
    }
    callback = callback_;
  }
  if (callback) callback(peer, step);
  return absl::FailedPreconditionError(why);
}

void StepFence::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--in_flight_ == 0) drained_.notify_all();
}

absl::Status StepFence::Open(uint64_t step, const std::function<void()>& cut) {
  return Move(true, step, cut);
}

absl::Status StepFence::Close(const std::function<void()>& cut) { return Move(false, 0, cut); }

absl::Status StepFence::Move(bool open, uint64_t step, const std::function<void()>& cut) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool same = armed_ && open_ == open && (!open || step_ == step);
  armed_ = true;
  open_ = open;
  step_ = step;
  if (same || in_flight_ == 0) return absl::OkStatus();
  // Writes admitted under the old state are still landing: interrupt them and wait, so that
  // none lands after this returns.
  const int64_t interrupted = in_flight_;
  const auto deadline = std::chrono::steady_clock::now() + kDrainTimeout;
  while (in_flight_ > 0) {
    lock.unlock();
    if (cut) cut();
    lock.lock();
    if (drained_.wait_until(
            lock,
            std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)),
            [&] { return in_flight_ == 0; })) {
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          transport_, " transport: ", in_flight_, " write(s) of the previous step still landing ",
          kDrainTimeout.count(), " ms after they were interrupted"));
    }
  }
  spdlog::warn("{} transport: interrupted {} write(s) of the previous step before {}", transport_,
               interrupted, open ? absl::StrCat("opening step ", step) : "closing the fence");
  return absl::OkStatus();
}

uint64_t StepFence::Refused(uint64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = refused_.find(step);
  return it == refused_.end() ? 0 : it->second;
}

void StepFence::SetCallback(FenceCallback cb) {
  std::lock_guard<std::mutex> lock(mu_);
  callback_ = std::move(cb);
}

}  // namespace wb::transport
