#include "daemon/staging/ack_book.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::staging {

std::string ReadyAudience(std::optional<uid_t> owner) {
  return owner ? absl::StrCat("staged objects of uid ", *owner) : "staged objects";
}

uint64_t AckBook::Enter(const std::string& watcher, bool swap, std::optional<uid_t> owner,
                        bool listening) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_++;
  watching_[id] = {id, watcher, swap, owner, listening};
  return id;
}

void AckBook::Listening(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = watching_.find(id);
  if (it != watching_.end()) it->second.listening = true;
}

void AckBook::Leave(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = watching_.find(id);
  if (it == watching_.end()) return;
  const Key key{it->second.owner, it->second.name};
  watching_.erase(it);
  // The last stream of that user and name: its answers go too (the book holds only open
  // watchers').
  bool more = false;
  for (const auto& [other, w] : watching_) more = more || Key{w.owner, w.name} == key;
  if (!more) answers_.erase(key);
  changed_.SignalAll();
}

absl::Status AckBook::Ack(const std::string& watcher, uint64_t version, const std::string& error,
                          std::optional<uid_t> caller) {
  absl::MutexLock lock(&mu_);
  bool mine = false;
  std::optional<uid_t> other;
  for (const auto& [id, w] : watching_) {
    if (w.name != watcher) continue;
    if (w.owner == caller || !w.owner || !caller) {
      mine = true;
    } else {
      other = w.owner;
    }
  }
  if (!mine && other) {
    return absl::PermissionDeniedError(absl::StrCat("ack of version ", version, ": watcher '",
                                                    watcher, "' is watched by another user (uid ",
                                                    *other, ", not ", *caller, ")"));
  }
  if (!mine) {
    return absl::NotFoundError(absl::StrCat(
        "ack of version ", version, ": no watch stream of watcher '", watcher,
        "' asked to acknowledge (watch with ack or swap and this watcher name first)"));
  }
  // Recorded for every stream of this name the caller may answer for (its own user's; an
  // unknown user on either side matches, as before users were told apart).
  for (const auto& [id, w] : watching_) {
    if (w.name != watcher || (w.owner && caller && *w.owner != *caller)) continue;
    Answer& a = answers_[Key{w.owner, w.name}];
    if (version >= a.version) a = {version, error};
  }
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

std::vector<AckBook::Entry> AckBook::Watching() const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  for (const auto& [id, w] : watching_) {
    if (w.listening) out.push_back(w);
  }
  return out;
}

absl::Status AckBook::Wait(uint64_t version, std::chrono::milliseconds timeout) {
  std::set<uint64_t> ids;
  for (const Entry& e : Watching()) ids.insert(e.id);
  return Wait(version, timeout, ids);
}

void AckBook::Interrupt(uint64_t version, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (version < interrupted_) return;
  interrupted_ = version;
  interrupt_reason_ = reason;
  changed_.SignalAll();
}

absl::Status AckBook::Wait(uint64_t version, std::chrono::milliseconds timeout,
                           const std::set<uint64_t>& waiting) {
  absl::MutexLock lock(&mu_);
  std::map<uint64_t, std::string> names_at_start;  // for a watcher that leaves (leaving_fails)
  for (uint64_t id : waiting) {
    if (auto w = watching_.find(id); w != watching_.end()) names_at_start[id] = w->second.name;
  }
  auto left = [&]() -> std::string {
    if (!options_.leaving_fails) return "";
    for (const auto& [id, name] : names_at_start) {
      if (!watching_.count(id)) {
        return absl::StrCat("watcher '", name, "' stopped watching before it answered version ",
                            version);
      }
    }
    return "";
  };
  // The watchers still owing an answer: chosen at the start and still watching.
  auto owing = [&]() {
    std::set<std::string> names;
    for (uint64_t id : waiting) {
      auto w = watching_.find(id);
      if (w == watching_.end()) continue;  // its stream ended: not waited for
      auto a = answers_.find(Key{w->second.owner, w->second.name});
      if (a == answers_.end() || a->second.version < version) names.insert(w->second.name);
    }
    return names;
  };
  auto failed = [&]() -> std::string {
    for (uint64_t id : waiting) {
      auto w = watching_.find(id);
      if (w == watching_.end()) continue;
      auto a = answers_.find(Key{w->second.owner, w->second.name});
      if (a != answers_.end() && a->second.version == version && !a->second.error.empty()) {
        return absl::StrCat("watcher '", w->second.name, "' ", options_.failed, " version ",
                            version, ": ", a->second.error);
      }
    }
    return "";
  };
  auto interrupted = [&]() { return interrupted_ == version; };
  auto settled = [&]() {
    return interrupted() || owing().empty() || !failed().empty() || !left().empty();
  };
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  while (!settled() && !changed_.WaitWithDeadline(&mu_, deadline)) {
  }
  if (interrupted()) return absl::AbortedError(interrupt_reason_);
  if (std::string why = failed(); !why.empty()) return absl::AbortedError(why);
  if (std::string why = left(); !why.empty()) return absl::AbortedError(why);
  if (auto names = owing(); !names.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("watcher(s) ", absl::StrJoin(names, ", "), " did not acknowledge version ",
                     version, " within ", timeout.count(), " ms (", options_.timeout_setting, ")"));
  }
  return absl::OkStatus();
}

}  // namespace wb::staging
