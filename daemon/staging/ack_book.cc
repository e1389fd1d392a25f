#include "daemon/staging/ack_book.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::staging {

uint64_t AckBook::Enter(const std::string& watcher, bool swap, std::optional<uid_t> owner) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_++;
  watching_[id] = {watcher, swap, owner};
  return id;
}

void AckBook::Leave(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = watching_.find(id);
  if (it == watching_.end()) return;
  const std::string name = it->second.name;
  watching_.erase(it);
  // The last stream of that name: its answers go too (the book holds only open watchers').
  bool more = false;
  for (const auto& [other, w] : watching_) more = more || w.name == name;
  if (!more) answers_.erase(name);
  changed_.SignalAll();
}

absl::Status AckBook::Ack(const std::string& watcher, uint64_t version, const std::string& error,
                          std::optional<uid_t> caller) {
  absl::MutexLock lock(&mu_);
  bool known = false;
  for (const auto& [id, w] : watching_) {
    if (w.name != watcher) continue;
    known = true;
    if (w.owner && caller && *w.owner != *caller) {
      return absl::PermissionDeniedError(absl::StrCat("ack of version ", version, ": watcher '",
                                                      watcher, "' is watched by another user (uid ",
                                                      *w.owner, ", not ", *caller, ")"));
    }
  }
  if (!known) {
    return absl::NotFoundError(absl::StrCat(
        "ack of version ", version, ": no watch stream of watcher '", watcher,
        "' asked to acknowledge (watch with ack or swap and this watcher name first)"));
  }
  Answer& a = answers_[watcher];
  if (version >= a.version) a = {version, error};
  changed_.SignalAll();
  return absl::OkStatus();
}

bool AckBook::AnySwapper() const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : watching_) {
    if (w.swap) return true;
  }
  return false;
}

absl::Status AckBook::Wait(uint64_t version, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  std::set<uint64_t> waiting;
  for (const auto& [id, w] : watching_) waiting.insert(id);
  // The watchers still owing an answer: entered at the start and still watching.
  auto owing = [&]() {
    std::set<std::string> names;
    for (uint64_t id : waiting) {
      auto w = watching_.find(id);
      if (w == watching_.end()) continue;  // its stream ended: not waited for
      auto a = answers_.find(w->second.name);
      if (a == answers_.end() || a->second.version < version) names.insert(w->second.name);
    }
    return names;
  };
  auto failed = [&]() -> std::string {
    for (uint64_t id : waiting) {
      auto w = watching_.find(id);
      if (w == watching_.end()) continue;
      auto a = answers_.find(w->second.name);
      if (a != answers_.end() && a->second.version == version && !a->second.error.empty()) {
        return absl::StrCat("watcher '", w->second.name, "' failed to swap version ", version, ": ",
                            a->second.error);
      }
    }
    return "";
  };
  auto settled = [&]() { return owing().empty() || !failed().empty(); };
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  while (!settled() && !changed_.WaitWithDeadline(&mu_, deadline)) {
  }
  if (std::string why = failed(); !why.empty()) return absl::AbortedError(why);
  if (auto names = owing(); !names.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("watcher(s) ", absl::StrJoin(names, ", "), " did not acknowledge version ",
                     version, " within ", timeout.count(), " ms (receive.ack_timeout_ms)"));
  }
  return absl::OkStatus();
}

}  // namespace wb::staging
