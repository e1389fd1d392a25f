// Fencing of controllers by leader epoch (issue 45): a controller elected through etcd
// (controller/leader_election.h) sends its epoch, the election key's create_revision, as the
// metadata "wb-leader-epoch" on every call to an agent. The agent remembers the newest epoch it
// has seen and refuses a call from an older one, naming both: a deposed leader that wakes up
// (frozen past its lease, or partitioned from etcd) can no longer drive a step. A call without
// an epoch is admitted until an epoch has been seen (a controller without high availability),
// refused after. Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/synchronization/mutex.h"

namespace wb::service {

inline constexpr char kLeaderEpochKey[] = "wb-leader-epoch";

class LeaderFence {
 public:
  explicit LeaderFence(std::string agent) : agent_(std::move(agent)) {}

  // OK, or FAILED_PRECONDITION (an older epoch, or none after one) / INVALID_ARGUMENT (not a
  // number); `method` names the call in the message.
  grpc::Status Admit(const grpc::ServerContextBase& ctx, const std::string& method);
  // The same for an epoch carried in a message (a step command on a step link or stream, which
  // was admitted when it opened: a leader deposed since must not go on driving it); 0: none.
  grpc::Status AdmitEpoch(int64_t epoch, const std::string& method);
  // The newest epoch seen (0: none).
  int64_t newest() const;

 private:
  const std::string agent_;
  mutable absl::Mutex mu_;
  int64_t newest_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace wb::service
