// The watchers a staged swap waits for (WatchEventsRequest.ack / swap): each watch stream that
// asked is entered here while it lasts; SessionRequest.ack records its answer for a version.
// The swap of version v waits until every watcher it chose when it started has answered v, has
// ended its stream, or the timeout passes. Watcher names are scoped per user (SO_PEERCRED): a
// name another user took first neither hides nor refuses this user's watcher. Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace wb::staging {

// KIND_READY's reason: the user whose staging objects it lists. A swap tells ready(v) once per
// user with a swap watcher; local::LocalService sends each to that user's swap watchers only.
std::string ReadyAudience(std::optional<uid_t> owner);

class AckBook {
 public:
  // How the book words its errors, and whether a watcher that leaves unanswered fails a wait.
  struct Options {
    std::string failed = "failed to swap";  // "watcher 'w' <failed> version v: <its error>"
    std::string timeout_setting = "receive.ack_timeout_ms";
    // A check (VersionChecks.user) must be answered: a watcher whose stream ends before it
    // answered fails the wait instead of being no longer waited for.
    bool leaving_fails = false;
  };
  AckBook() = default;
  explicit AckBook(Options options) : options_(std::move(options)) {}

  // A watcher open now, as Watching lists it.
  struct Entry {
    uint64_t id = 0;
    std::string name;
    bool swap = false;
    std::optional<uid_t> owner;
    bool listening = true;  // its stream hears every event published from now on
  };

  // A watch stream that acknowledges, by watcher name; `swap`: it swaps the staged bytes
  // itself; `owner`: the user id of the process watching (SO_PEERCRED), when known. Returns the
  // id to Leave with when the stream ends.
  // `listening` false: its stream is not subscribed to the events yet; Listening(id) once it
  // is. A swap waits only for watchers listening before it told begin(v) / ready(v).
  uint64_t Enter(const std::string& watcher, bool swap, std::optional<uid_t> owner = {},
                 bool listening = true);
  void Listening(uint64_t id);
  void Leave(uint64_t id);
  // A watcher's answer for `version` (error: its swap failed), from a process of user `caller`
  // when known. It counts for the watcher of that name of the caller's own user. NotFound for
  // a watcher no open stream has entered; PermissionDenied when only another user watches
  // under that name (one user cannot let a swap go on under another's engine).
  absl::Status Ack(const std::string& watcher, uint64_t version, const std::string& error,
                   std::optional<uid_t> caller = {});
  // Whether a watcher that swaps by itself is watching now.
  bool AnySwapper() const;
  // Every watcher open and listening now: a swap chooses whom it waits for (and tells) from
  // this one list.
  std::vector<Entry> Watching() const;
  // Waits as above for every watcher open now. DeadlineExceeded names the watchers that did
  // not answer; Aborted names a watcher that answered with an error.
  absl::Status Wait(uint64_t version, std::chrono::milliseconds timeout);
  // The same for the watchers `ids` only (from Watching; those that left are not waited for).
  // Ends early, Aborted with its reason, when Interrupt(version) is called.
  absl::Status Wait(uint64_t version, std::chrono::milliseconds timeout,
                    const std::set<uint64_t>& ids);
  // Ends a Wait of `version` (its step was aborted).
  void Interrupt(uint64_t version, const std::string& reason);

 private:
  using Key = std::pair<std::optional<uid_t>, std::string>;  // (user, watcher name)
  struct Answer {
    uint64_t version = 0;
    std::string error;
  };
  const Options options_;
  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> watching_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Answer> answers_ ABSL_GUARDED_BY(mu_);  // the latest, by user and name
  uint64_t interrupted_ ABSL_GUARDED_BY(mu_) = 0;       // the version Interrupt ended
  std::string interrupt_reason_ ABSL_GUARDED_BY(mu_);
  absl::CondVar changed_;  // an answer came, a stream ended or a wait was interrupted
};

}  // namespace wb::staging
