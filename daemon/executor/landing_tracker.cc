#include "daemon/executor/landing_tracker.h"

#include <algorithm>
#include <iterator>

namespace wb::executor {

void LandingTracker::Open(uint64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = step;
    open_step_.store(step, std::memory_order_release);
    ranges_.clear();
    all_landed_ = false;
    touched_.clear();
    touched_overflow_ = false;
    ended_peer_.clear();
    ended_peers_.clear();
    ++changes_;
  }
  cv_.notify_all();
}

void LandingTracker::Landed(uint64_t step, const void* addr, uint64_t length) {
  if (length == 0 || step == 0 || step != open_step_.load(std::memory_order_acquire)) return;
  uintptr_t begin = reinterpret_cast<uintptr_t>(addr);
  uintptr_t end = begin + length;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (step != step_ || step == 0) return;
    // Merge with every range that overlaps or touches [begin, end).
    auto it = ranges_.upper_bound(begin);
    if (it != ranges_.begin() && std::prev(it)->second >= begin) --it;
    while (it != ranges_.end() && it->first <= end) {
      begin = std::min(begin, it->first);
      end = std::max(end, it->second);
      it = ranges_.erase(it);
    }
    ranges_.emplace(begin, end);
    if (touched_.size() < kMaxTouched) {
      touched_.push_back(begin);
    } else {
      touched_overflow_ = true;
    }
    ++changes_;
  }
  cv_.notify_all();
}

void LandingTracker::LandAll(uint64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (step == 0 || step != step_) return;
    all_landed_ = true;
    ++changes_;
  }
  cv_.notify_all();
}

bool LandingTracker::TakeTouched(uint64_t step, std::vector<Range>* out) const {
  out->clear();
  std::lock_guard<std::mutex> lock(mu_);
  if (step != step_) return true;  // nothing of `step` lands here
  const bool exact = !touched_overflow_ && !all_landed_;
  if (exact) {
    for (uintptr_t at : touched_) {
      // The range holding `at` now (a later landing may have merged it into another).
      auto it = ranges_.upper_bound(at);
      if (it == ranges_.begin()) continue;
      --it;
      if (!out->empty() && out->back().begin == it->first) continue;
      out->push_back({it->first, it->second});
    }
  }
  touched_.clear();
  touched_overflow_ = false;
  return exact;
}

bool LandingTracker::Covered(uint64_t step, const void* addr, uint64_t length) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lock(mu_);
  if (step != step_) return false;
  if (length == 0 || all_landed_) return true;
  auto it = ranges_.upper_bound(begin);
  if (it == ranges_.begin()) return false;
  --it;
  return it->first <= begin && it->second >= begin + length;
}

void LandingTracker::PeerEnded(const std::string& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (step_ == 0 || ended_peers_.count(peer)) return;
    ended_peers_.insert(peer);
    if (ended_peer_.empty()) ended_peer_ = peer;
    ++changes_;
  }
  cv_.notify_all();
}

std::string LandingTracker::ended_peer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_peer_;
}

std::string LandingTracker::EndedAmong(const std::set<std::string>& feeders) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (feeders.empty()) return ended_peer_;
  for (const auto& peer : ended_peers_) {
    if (feeders.count(peer)) return peer;
  }
  return "";
}

uint64_t LandingTracker::changes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return changes_;
}

uint64_t LandingTracker::WaitChange(uint64_t seen,
                                    std::chrono::steady_clock::time_point until) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, until, [&] { return changes_ != seen; });
  return changes_;
}

}  // namespace wb::executor
