#include "controller/plan_scheduler.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

PlanScheduler::PlanScheduler(ControllerCore* core, size_t max_waiting)
    : core_(core), max_waiting_(max_waiting), thread_([this] { Run(); }) {}

PlanScheduler::~PlanScheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& w : waiting_) w.done(absl::UnavailableError("the controller is shutting down"));
}

void PlanScheduler::Submit(v1::PlanRequest req, std::function<bool()> cancelled, Done done) {
  auto world = core_->RequestedWorld(req);
  if (!world.ok()) {
    done(world.status());
    return;
  }
  Waiting w;
  w.wait = core_->PlanWait(req);
  w.deadline = Clock::now() + w.wait;
  w.world = *world;
  w.req = std::move(req);
  w.cancelled = std::move(cancelled);
  w.done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiting_.size() + settling_ < max_waiting_ && !stopping_) {
      waiting_.push_back(std::move(w));
      cv_.notify_all();
      return;
    }
  }
  w.done(absl::ResourceExhaustedError(
      absl::StrCat(max_waiting_, " Plan calls are already waiting; try again later")));
}

bool PlanScheduler::Settle(Waiting& w) {
  if (w.cancelled && w.cancelled()) {
    spdlog::info("a waiting Plan was dropped: its caller went away");
    w.done(absl::CancelledError("the Plan caller went away"));
    return true;
  }
  std::string missing;
  if (core_->WorldReady(w.world, &missing)) {
    w.done(core_->PlanNow(w.req, w.world));
    return true;
  }
  if (Clock::now() >= w.deadline) {
    w.done(absl::DeadlineExceededError(absl::StrCat("the world is incomplete after waiting ",
                                                    w.wait.count(), " ms; missing: ", missing)));
    return true;
  }
  return false;
}

void PlanScheduler::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // New calls wake us; membership changes and cancellations are polled.
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    if (stopping_) break;
    std::deque<Waiting> batch;
    batch.swap(waiting_);
    settling_ = batch.size();
    lock.unlock();
    std::deque<Waiting> kept;
    for (auto& w : batch) {
      const bool settled = Settle(w);
      if (!settled) kept.push_back(std::move(w));
      if (settled) {
        std::lock_guard<std::mutex> one(mu_);
        --settling_;
      }
    }
    lock.lock();
    settling_ = 0;
    // Those that arrived meanwhile go after the older ones.
    for (auto& w : waiting_) kept.push_back(std::move(w));
    waiting_.swap(kept);
  }
}

}  // namespace wb::controller
