// A small pool of long-lived threads for work that used to start a thread per call (the
// agent's Execute / LoadPlan handlers, the executor's prepare stage). It grows when every
// worker is busy, so a task that blocks (a step waiting on peers) never starves the others,
// and keeps its threads for reuse: after warm-up no call pays for thread creation.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace wb::executor {

class WorkerPool {
 public:
  // Starts `initial` workers now.
  explicit WorkerPool(int initial = 0) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < initial; ++i) AddWorkerLocked();
  }
  // Runs the queued tasks, then joins every worker.
  ~WorkerPool() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (auto& t : threads_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `task` on an idle worker, or on a new one when all are busy.
  void Submit(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
    if (idle_ < static_cast<int>(tasks_.size())) AddWorkerLocked();
  }

  int threads() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(threads_.size());
  }

 private:
  void AddWorkerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    threads_.emplace_back([this] { Work(); });
  }

  void Work() {
    absl::MutexLock lock(&mu_);
    while (true) {
      ++idle_;
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
      mu_.Await(absl::Condition(&ready));
      --idle_;
      if (tasks_.empty()) return;  // stopping, nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      mu_.Unlock();
      task();
      mu_.Lock();
    }
  }

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace wb::executor
