// The receiving side's step fence for software transports (tcp, local): which step's writes
// may land now. Begin opens step N, commit or abort closes it; a write tagged with any other
// step is refused before it touches memory. Opening or closing returns only once no write
// admitted under the previous state is still landing, so an aborted or timed-out step can
// never put bytes into a destination after the next step began (docs/security.md, class 8).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "daemon/transport/transport.h"

namespace wb::transport {

class StepFence {
 public:
  // Held while one admitted write lands; the fence cannot move on until it is released.
  class Pass {
   public:
    Pass() = default;
    Pass(Pass&& other) noexcept : fence_(std::exchange(other.fence_, nullptr)) {}
    Pass& operator=(Pass&& other) noexcept;
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    ~Pass() { Release(); }
    void Release();

   private:
    friend class StepFence;
    explicit Pass(StepFence* fence) : fence_(fence) {}
    StepFence* fence_ = nullptr;
  };

  // `transport` names the owner in messages ("tcp", "local").
  explicit StepFence(std::string transport);

  // Admits a write of `step` from `peer`, or refuses it (FAILED_PRECONDITION naming both
  // steps; counted, reported to the fence callback, logged once per peer and step).
  absl::Status Admit(uint64_t step, const std::string& peer, Pass* pass);

  // Moves the fence (arming it if needed). Writes admitted before that are still landing are
  // interrupted with `cut` (called without the fence's lock; it may be called again while
  // they drain) and waited for, at most `drain_timeout`.
  absl::Status Open(uint64_t step, const std::function<void()>& cut);
  absl::Status Close(const std::function<void()>& cut);

  uint64_t Refused(uint64_t step) const;
  void SetCallback(FenceCallback cb);

  static constexpr std::chrono::milliseconds kDrainTimeout{5000};

 private:
  absl::Status Move(bool open, uint64_t step, const std::function<void()>& cut);
  void Leave();

  const std::string transport_;
  mutable std::mutex mu_;
  std::condition_variable drained_;
  bool armed_ = false;  // a bare transport (no agent) accepts everything
  bool open_ = false;
  uint64_t step_ = 0;
  int64_t in_flight_ = 0;                 // admitted writes still landing
  std::map<uint64_t, uint64_t> refused_;  // step -> refused writes (the last few steps)
  std::set<std::pair<std::string, uint64_t>> logged_;  // (peer, step) refusals already logged
  FenceCallback callback_;
};

}  // namespace wb::transport
