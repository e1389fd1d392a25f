// Plan calls waiting for their world, owned by one thread: a waiting Plan costs no thread of
// its own and holds no lock (steps of the current plan go on), a caller that goes away is
// dropped, and no wait outlasts the configured plan_wait_ms.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "controller/controller_core.h"

namespace wb::controller {

class PlanScheduler {
 public:
  using Done = std::function<void(absl::StatusOr<weightbeam::v1::PlanSummary>)>;

  explicit PlanScheduler(ControllerCore* core, size_t max_waiting = 64);
  ~PlanScheduler();  // fails what still waits (UNAVAILABLE) and joins the thread
  PlanScheduler(const PlanScheduler&) = delete;
  PlanScheduler& operator=(const PlanScheduler&) = delete;

  // `done` runs exactly once: here when the request is refused at once (an absurd world, too
  // many waiting), else on the scheduler's thread. `cancelled` is polled while it waits.
  void Submit(weightbeam::v1::PlanRequest req, std::function<bool()> cancelled, Done done);

 private:
  struct Waiting {
    weightbeam::v1::PlanRequest req;
    weightbeam::v1::ExpectedWorld world;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds wait;
    std::function<bool()> cancelled;
    Done done;
  };
  void Run();
  // Finishes `w` when its caller left, its world is complete or its wait is over.
  bool Settle(Waiting& w);

  ControllerCore* const core_;
  const size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;  // guarded by mu_
  // Taken out of waiting_ by the scheduler's pass (a PlanNow may run for seconds): they still
  // count against max_waiting_. Guarded by mu_.
  size_t settling_ = 0;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace wb::controller
