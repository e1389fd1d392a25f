// A controller with a standby (issue 45, docs/reliability.md): wb-controller with `ha:` runs
// as the leader of its election or as a standby. The leader drives steps, its agent calls
// carrying its epoch (the election key's etcd create_revision); a standby takes registrations
// and heartbeats (it holds every layout, warm) and answers Plan / Step / Rollback with
// UNAVAILABLE naming the leader, so clients move on to it. Elected, a controller takes over:
// it loads the ledger the last leader wrote to etcd, waits for the plan's agents, plans again
// and asks the receivers what they committed (ControllerCore::TakeOver), then serves. While
// leading it writes the ledger after every step (coalesced, on its own thread, only while it
// still holds the election key), and it stops driving agents the moment its lease could be
// lost (LeaderElection::IsLeader, checked before every call).
//
// Every candidate also keeps a member key /weightbeam/members/<election>/<address> on its own
// lease: that is how `wbctl status` lists the standbys.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/etcd/etcd_client.h"
#include "config/config.h"
#include "controller/controller_core.h"
#include "controller/controller_role.h"
#include "controller/leader_election.h"

namespace wb::controller {

// `listen` as others reach it: a wildcard host ("0.0.0.0", "[::]", "") becomes the host name.
std::string AdvertisedAddress(const std::string& listen);

class HighAvailability : public ControllerRole {
 public:
  // `core` must outlive this; `takeover_wait`: how long a new leader waits for the saved
  // plan's agents to register (the controller's plan_wait_ms).
  HighAvailability(const config::HaConfig& ha, ControllerCore* core,
                   std::chrono::milliseconds takeover_wait);
  ~HighAvailability() override;

  // Starts campaigning (and the member and ledger threads). Fails when etcd never answers
  // within a few seconds: the configuration is probably wrong.
  absl::Status Start();
  // Leaves the election at once (SIGTERM): a standby takes over without waiting for the TTL.
  void Stop();

  grpc::Status MayLead() const override;
  weightbeam::v1::Leadership Describe() const override;

 private:
  enum class State { kStandby, kTakingOver, kLeader };
  static const char* Name(State s);

  void OnElected(int64_t epoch);
  void OnLost();
  void RunTakeover(int64_t epoch);
  void RunMembers();
  void RunLedgerWriter();
  void SetState(State s);
  // A standby that knows no other leader reads the election key now.
  void RefreshLeader() const;

  const config::HaConfig ha_;
  ControllerCore* const core_;
  const std::chrono::milliseconds takeover_wait_;
  const std::string election_key_;
  const std::string ledger_key_;
  const std::string members_prefix_;
  mutable etcd::EtcdClient etcd_;
  std::unique_ptr<LeaderElection> election_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kStandby;
  int64_t since_unix_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t takeover_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the takeover running or done
  // Seen by the member thread: who leads, the other candidates.
  mutable std::string leader_ ABSL_GUARDED_BY(mu_);
  mutable int64_t leader_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> standbys_ ABSL_GUARDED_BY(mu_);
  std::optional<weightbeam::v1::ControllerLedger> pending_ledger_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread takeover_;
  std::thread members_;
  std::thread writer_;
};

}  // namespace wb::controller
