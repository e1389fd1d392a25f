// A FIFO between pipeline stages: Push never blocks, Pop waits until an item or Close().
#pragma once

#include <deque>
#include <optional>

#include "absl/synchronization/mutex.h"

namespace wb::executor {

template <typename T>
class BlockingQueue {
 public:
  void Push(T item) {
    absl::MutexLock lock(&mu_);
    items_.push_back(std::move(item));
  }
  // Returns nullopt once the queue is closed and drained.
  std::optional<T> Pop() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BlockingQueue::Ready));
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !items_.empty(); }

  absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace wb::executor
