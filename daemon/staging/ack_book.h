// The watchers a staged swap waits for (WatchEventsRequest.ack / swap): each watch stream that
// asked is entered here while it lasts; SessionRequest.ack records its answer for a version.
// The swap of version v waits until every watcher entered when it started has answered v, has
// ended its stream, or the timeout passes. Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace wb::staging {

class AckBook {
 public:
  // A watch stream that acknowledges, by watcher name; `swap`: it swaps the staged bytes
  // itself; `owner`: the user id of the process watching (SO_PEERCRED), when known. Returns the
  // id to Leave with when the stream ends.
  uint64_t Enter(const std::string& watcher, bool swap, std::optional<uid_t> owner = {});
  void Leave(uint64_t id);
  // A watcher's answer for `version` (error: its swap failed), from a process of user `caller`
  // when known. NotFound for a watcher no open stream has entered; PermissionDenied when the
  // watcher's stream belongs to another user (one user cannot let a swap go on under
  // another's engine).
  absl::Status Ack(const std::string& watcher, uint64_t version, const std::string& error,
                   std::optional<uid_t> caller = {});
  // Whether a watcher that swaps by itself is watching now.
  bool AnySwapper() const;
  // Waits as above. DeadlineExceeded names the watchers that did not answer; Aborted names a
  // watcher that answered with an error.
  absl::Status Wait(uint64_t version, std::chrono::milliseconds timeout);

 private:
  struct Watcher {
    std::string name;
    bool swap = false;
    std::optional<uid_t> owner;
  };
  struct Answer {
    uint64_t version = 0;
    std::string error;
  };
  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Watcher> watching_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Answer> answers_ ABSL_GUARDED_BY(mu_);  // the latest, by watcher name
  absl::CondVar changed_;                                       // an answer came or a stream ended
};

}  // namespace wb::staging
