// Leader election among controllers through an etcd lease (issue 45, the foundation: not wired
// into wb-controller yet). Each candidate campaigns by granting a lease and, in one transaction,
// creating the election key attached to it if the key does not exist. The one that creates it
// leads; its epoch is the key's create_revision, an etcd store revision, so every later leader has
// a larger epoch and stale leaders can be fenced by it. A background thread keeps the lease alive
// and steps down (on_lost, IsLeader() false) once keepalives have failed for ttl - margin: the
// lease cannot have expired yet, so no standby can be leading while this one still believes it
// leads. Standbys poll the key and campaign again when it is gone (revoked or expired).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/etcd/etcd_client.h"

namespace wb::controller {

// Who leads an election: the leader's candidate id and its epoch (the key's create_revision).
struct LeaderInfo {
  std::string id;
  int64_t epoch = 0;
};

struct LeaderElectionOptions {
  absl::Duration ttl = absl::Seconds(10);
  // How long before the lease could expire the leader steps down: room for the controller to stop
  // acting as leader, and for clock rates to differ. Zero: ttl / 4.
  absl::Duration margin = absl::ZeroDuration();
  // How often a standby looks at the key, and a failing leader retries its keepalive. Zero:
  // ttl / 6.
  absl::Duration poll = absl::ZeroDuration();
};

class LeaderElection {
 public:
  using OnElected = std::function<void(int64_t epoch)>;
  using OnLost = std::function<void()>;

  // `etcd` must outlive this. The key is "/weightbeam/election/<election_name>".
  LeaderElection(etcd::EtcdClient* etcd, std::string election_name, std::string candidate_id,
                 absl::Duration ttl);
  LeaderElection(etcd::EtcdClient* etcd, std::string election_name, std::string candidate_id,
                 LeaderElectionOptions options);
  ~LeaderElection();  // Resign(): a controller that exits cleanly hands over at once

  // Starts campaigning on a background thread. Callbacks run on that thread; on_lost follows
  // every on_elected exactly once unless Resign() ends the leadership first.
  void Start(OnElected on_elected, OnLost on_lost);
  // Leaves the election: stops the thread and revokes the lease, which deletes the key if this
  // candidate held it, so a standby takes over without waiting for the TTL. No on_lost.
  absl::Status Resign();

  // True while this candidate leads and its lease is certainly still alive. Checks the deadline
  // itself, so it turns false in time even while the thread is stuck in a call to etcd.
  bool IsLeader() const;
  int64_t Epoch() const;  // this candidate's epoch while it leads, else 0
  // Reads who leads now from etcd (nullopt: nobody).
  absl::StatusOr<std::optional<LeaderInfo>> Leader() const;
  const std::string& key() const { return key_; }

  // Test hook: while paused this candidate makes no calls to etcd at all, as if cut off from it;
  // a leader stops renewing its lease and must step down on its own before the lease expires.
  void PauseKeepAlivesForTest(bool paused) { paused_ = paused; }

 private:
  using Clock = std::chrono::steady_clock;

  void Run();
  void StandbyRound();
  void Campaign();
  void LeadRound();
  void StepDown(const std::string& why);
  void BecomeLeader(int64_t lease_id, int64_t epoch, Clock::time_point lease_deadline);
  // Sleeps `d` or until Resign(); false when stopping.
  bool Sleep(absl::Duration d);
  bool Stopping();
  void SetDeadline(Clock::time_point t) { deadline_ns_ = t.time_since_epoch().count(); }
  Clock::time_point Deadline() const {
    return Clock::time_point(Clock::duration(deadline_ns_.load()));
  }

  etcd::EtcdClient* const etcd_;
  const std::string key_;
  const std::string candidate_id_;
  const absl::Duration ttl_;
  const absl::Duration margin_;
  const absl::Duration poll_;
  OnElected on_elected_;
  OnLost on_lost_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;

  std::atomic<bool> paused_{false};
  std::atomic<bool> leader_{false};
  std::atomic<int64_t> epoch_{0};
  std::atomic<int64_t> deadline_ns_{0};  // steady clock: step down at this instant
  int64_t lease_id_ = 0;                 // touched by the thread only, or after joining it
};

}  // namespace wb::controller
