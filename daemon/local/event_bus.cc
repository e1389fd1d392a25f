#include "daemon/local/event_bus.h"

namespace wb::local {

uint64_t EventBus::Subscribe(Listener listener) {
  absl::MutexLock lock(&mu_);
  uint64_t id = next_++;
  listeners_[id] = std::move(listener);
  return id;
}

void EventBus::Unsubscribe(uint64_t id) {
  absl::MutexLock lock(&mu_);
  listeners_.erase(id);
}

void EventBus::Publish(const weightbeam::v1::Event& event) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, l] : listeners_) l(event);
}

size_t EventBus::subscribers() const {
  absl::MutexLock lock(&mu_);
  return listeners_.size();
}

}  // namespace wb::local
