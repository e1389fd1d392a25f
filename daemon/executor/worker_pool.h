// A small pool of long-lived threads for work that used to start a thread per call (the
// agent's Execute / LoadPlan handlers, the executor's prepare stage). It grows when every
// worker is busy, so a task that blocks (a step waiting on peers) never starves the others,
// and keeps its threads for reuse: after warm-up no call pays for thread creation.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace wb::executor {

class WorkerPool {
 public:
  // Starts `initial` workers now.
  explicit WorkerPool(int initial = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < initial; ++i) AddWorkerLocked();
  }
  // Runs the queued tasks, then joins every worker.
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs `task` on an idle worker, or on a new one when all are busy.
  void Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
      if (idle_ < static_cast<int>(tasks_.size())) AddWorkerLocked();
    }
    wake_.notify_one();
  }

  int threads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(threads_.size());
  }

 private:
  // Requires mu_.
  void AddWorkerLocked() {
    threads_.emplace_back([this] { Work(); });
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return;  // stopping, nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  // std::mutex rather than absl::Mutex: this sits on every step's path, and the system absl
  // is built with deadlock detection, which updates a global graph on lock operations.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  std::vector<std::thread> threads_;         // guarded by mu_
  int idle_ = 0;                             // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
};

}  // namespace wb::executor
