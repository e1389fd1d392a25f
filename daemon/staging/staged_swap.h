// receive.mode staged: the swap of a committed version into the live tensors, the restore of
// the mirrors after an unswapped step, and aborts, under one lock and one state machine
// (issue 41, item 4). One swap at a time moves through
//
//   idle -> waiting (begin(v) / ready(v) told, the watchers' answers awaited)
//        -> copying (staging -> live) -> idle, commit(v) told
//
// and the edges that matter are named: an abort of v while waiting ends the wait and v never
// goes live; an abort of v while copying waits for the copy and is answered "already
// committed" (no watcher ever hears abort(v) after commit(v), nor commit(v) after abort(v));
// the next step's restore waits for an unfinished swap (or refuses after a bound), so it never
// copies live -> staging while staging -> live still runs.
//
// Whose swap is whose (items 3 and 9): each tensor belongs to the user that registered it
// (SO_PEERCRED). A swap waits only for the watchers of the users whose tensors it writes,
// tells each swap watcher only of its own user's staging objects, and leaves to a swap watcher
// only its own user's tensors; every other tensor the agent copies itself.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/registry/region_registry.h"
#include "daemon/staging/ack_book.h"
#include "daemon/staging/version_history.h"
#include "weightbeam/v1/agent.pb.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::staging {

// What the swap touches outside itself, injected (the agent's registry and event bus; a unit
// test's fakes).
struct SwapEnvironment {
  using Tensors = std::vector<std::shared_ptr<const registry::RegisteredTensor>>;
  // Every destination tensor registered now.
  std::function<Tensors()> destinations;
  // Tells the local watchers (the agent's event bus).
  std::function<void(const weightbeam::v1::Event&)> publish;
  // Makes `version` the committed one and tells the watchers commit(v) (the agent's Advance);
  // called with the swap's lock held, so that no abort slips in between.
  std::function<absl::Status(uint64_t version)> commit;
  // The staging objects of user `owner` that a swap watcher copies from (ready(v)).
  std::function<std::vector<weightbeam::v1::StagedObject>(std::optional<uid_t> owner)>
      staged_objects;
  // The copies, one tensor each (staging_mirrors.h; a test may fail or slow them).
  std::function<absl::Status(const registry::RegisteredTensor&)> to_live = CopyToLive;
  std::function<absl::Status(const registry::RegisteredTensor&)> to_staging = CopyToStaging;
  // receive.keep_versions: where each swap keeps the version it replaces (null: none kept).
  VersionHistory* history = nullptr;
  // A rollback made `version` live again: the agent's committed version goes back to it and
  // the watchers hear commit(v) with `reason` (called with the swap's lock held).
  std::function<void(uint64_t version, const std::string& reason)> rolled_back;

  static absl::Status CopyToLive(const registry::RegisteredTensor& t);
  static absl::Status CopyToStaging(const registry::RegisteredTensor& t);
};

struct SwapOptions {
  std::string agent;  // for errors and logs
  std::chrono::milliseconds ack_timeout{5000};
  // How long a step's restore waits for an unfinished swap before refusing the step.
  std::chrono::milliseconds unfinished_wait{30000};
  // Test hook (receive.test_swap_delay_ms): held after the watchers answered, before the copy.
  std::chrono::milliseconds test_delay{0};
  uint64_t test_delay_version = 0;  // the version held (0: every version)
};

class StagedSwap {
 public:
  enum class Phase { kIdle, kWaiting, kCopying };
  // What an abort of a version met.
  enum class AbortOutcome {
    kTold,              // the watchers heard abort(v) (now, or from its failed swap)
    kAlreadyCommitted,  // its swap finished: commit(v) was told; abort(v) must not be
  };

  StagedSwap(AckBook* acks, SwapEnvironment env, SwapOptions options);

  // Before a step's (or a storage version's) writes may land in the mirrors: waits for an
  // unfinished swap (refusing past options.unfinished_wait), restores the mirrors a previous
  // step left unswapped, and marks them dirty. The caller holds its step fence.
  absl::Status BeforeStep(uint64_t version);
  // The swap of committed `version`: tells begin(v) / ready(v), waits for the watchers, copies
  // staging -> live (the tensors no swap watcher of their user swaps), tells commit(v).
  // Aborted (never DEADLINE_EXCEEDED) when it did not go live; the watchers heard abort(v).
  // `resp` gets the time the live tensors were written.
  absl::Status Swap(uint64_t version, weightbeam::v1::CommitResponse* resp);
  // The controller's abort of `version` (with `reason`), after its fence closed: tells the
  // watchers abort(v) unless they heard it already or v went live.
  AbortOutcome Abort(uint64_t version, const std::string& reason);
  // Makes kept `version` live again with one local copy (VersionHistory), the version live
  // now kept first so that it can be gone back to; the mirrors are restored from the live
  // tensors at the next step. Refused while a swap runs, naming it, and for a version not
  // kept, naming those that are. `from` gets the version that was live.
  absl::Status Rollback(uint64_t version, uint64_t* from);
  // The version the live tensors hold (0: the engine's own, before any swap).
  uint64_t live_version() const;

  // An aborted step's mirrors could not be restored (a swap watcher's tensors, or a failed
  // copy): delta patches must be refused until a dense step rewrote them.
  bool stale() const;
  void ClearStale();
  Phase phase() const;

 private:
  void Tell(weightbeam::v1::Event::Kind kind, uint64_t version, const std::string& reason);
  // The watchers of users owning tensors in `tensors`, and the users whose swap watcher swaps.
  struct Audience {
    std::set<uint64_t> waited;
    std::set<std::optional<uid_t>> owners, swapping;
  };
  Audience Choose(const SwapEnvironment::Tensors& tensors) const;
  absl::Status FailLocked(uint64_t version, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AckBook* const acks_;
  const SwapEnvironment env_;
  const SwapOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar moved_;  // the phase changed
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kIdle;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // the version in phase_ (waiting, copying)
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;  // an abort of version_ came while waiting
  uint64_t swapped_ ABSL_GUARDED_BY(mu_) = 0;  // the last version swapped in (commit told)
  uint64_t live_ ABSL_GUARDED_BY(mu_) = 0;     // what the live tensors hold (after a rollback:
                                               // the version rolled back to)
  uint64_t told_ ABSL_GUARDED_BY(mu_) = 0;     // the last version whose abort(v) was told here
  // A step began and its version was not swapped in yet (the mirrors may differ from live).
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool stale_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace wb::staging
