// Fans messages out to every subscriber, and a gRPC server-streaming reactor that forwards a
// subscription to one client in order (queueing while a write is in flight). Used for the
// agent's Local.WatchEvents and the controller's WatchSteps.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>

#include "absl/synchronization/mutex.h"

namespace wb {

template <typename T>
class Broadcaster {
 public:
  using Listener = std::function<void(const T&)>;
  // Listeners run on the publishing thread and must not block.
  uint64_t Subscribe(Listener listener) {
    absl::MutexLock lock(&mu_);
    uint64_t id = next_++;
    listeners_[id] = std::move(listener);
    return id;
  }
  // Like Subscribe, but first hands `listener` the message `first()` builds, atomically with
  // respect to Publish: nothing published before `first()` ran is delivered after it, and
  // nothing published after is missed.
  uint64_t SubscribeWithFirst(Listener listener, const std::function<T()>& first) {
    absl::MutexLock lock(&mu_);
    listener(first());
    uint64_t id = next_++;
    listeners_[id] = std::move(listener);
    return id;
  }
  void Unsubscribe(uint64_t id) {
    absl::MutexLock lock(&mu_);
    listeners_.erase(id);
  }
  void Publish(const T& message) {
    absl::MutexLock lock(&mu_);
    for (auto& [id, l] : listeners_) l(message);
  }
  size_t subscribers() const {
    absl::MutexLock lock(&mu_);
    return listeners_.size();
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Listener> listeners_ ABSL_GUARDED_BY(mu_);
};

// Streams everything published on `bus` to one client until it cancels. Deletes itself.
template <typename T>
class BroadcastWriter : public grpc::ServerWriteReactor<T> {
 public:
  // `first` (optional) builds a message sent before everything published from then on.
  explicit BroadcastWriter(Broadcaster<T>* bus, std::function<T()> first = nullptr)
      : BroadcastWriter(bus, Options{std::move(first), nullptr, nullptr}) {}

  struct Options {
    std::function<T()> first;            // as above
    std::function<bool(const T&)> keep;  // null: every message; else those it keeps
    std::function<void()> on_done;       // when the stream has ended
  };
  BroadcastWriter(Broadcaster<T>* bus, Options options)
      : bus_(bus), keep_(std::move(options.keep)), on_done_(std::move(options.on_done)) {
    auto push = [this](const T& m) {
      if (!keep_ || keep_(m)) Push(m);
    };
    id_ = options.first ? bus_->SubscribeWithFirst(push, options.first) : bus_->Subscribe(push);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      MaybeFinish(grpc::Status::CANCELLED);
      return;
    }
    queue_.pop_front();
    WriteNext();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    MaybeFinish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    bus_->Unsubscribe(id_);
    if (on_done_) on_done_();
    delete this;
  }

 private:
  void Push(const T& m) {
    absl::MutexLock lock(&mu_);
    if (finished_ || cancelled_) return;
    queue_.push_back(m);
    if (!writing_) WriteNext();
  }

  void WriteNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queue_.empty() || finished_) return;
    writing_ = true;
    this->StartWrite(&queue_.front());
  }

  void MaybeFinish(const grpc::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return;
    finished_ = true;
    this->Finish(s);
  }

  Broadcaster<T>* bus_;
  const std::function<bool(const T&)> keep_;
  const std::function<void()> on_done_;
  uint64_t id_ = 0;
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace wb
