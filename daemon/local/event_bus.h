// Fans begin/commit/abort events out to every local watcher (Local.WatchEvents streams).
#pragma once

#include <cstdint>
#include <functional>
#include <map>

#include "absl/synchronization/mutex.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::local {

class EventBus {
 public:
  using Listener = std::function<void(const weightbeam::v1::Event&)>;
  // Returns an id for Unsubscribe. Listeners run on the publishing thread and must not block.
  uint64_t Subscribe(Listener listener);
  void Unsubscribe(uint64_t id);
  void Publish(const weightbeam::v1::Event& event);
  size_t subscribers() const;

 private:
  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Listener> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wb::local
