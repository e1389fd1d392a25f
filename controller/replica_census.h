// The inference replicas behind the agents' layouts (docs/elastic.md): which agents hold each
// replica's ranks, whether every rank is on an alive agent, and the ledger of what each replica
// committed, from which the controller reports states and staleness.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "controller/membership.h"
#include "weightbeam/v1/controller.pb.h"

namespace wb::controller {

struct ReplicaView {
  std::set<std::string> agents;       // alive agents holding a rank of it
  std::set<std::string> lost_agents;  // lost agents whose last layout held a rank of it
  std::set<int> ranks;                // ranks registered on alive agents
  bool complete = false;              // every rank 0..ranks_per_replica-1 on an alive agent
  uint64_t tensors = 0;               // tensors registered on alive agents (every rank's)
  uint64_t registering_of = 0;        // set by MarkRegistering: the tensors its peers hold
};

// Same role, replica and rank: layout walks look at a run of one process's tensors once.
bool SameOwner(const weightbeam::v1::Owner& a, const weightbeam::v1::Owner& b);

// Every inference replica named by a tensor in `agents`' layouts (lost agents' last layouts
// too). `ranks_per_replica` 0: a replica is complete when its ranks are 0..max without a gap.
std::map<int, ReplicaView> CensusReplicas(const std::vector<AgentRecord>& agents,
                                          int ranks_per_replica);

// A worker registers its tensors one call at a time, and an agent reports its layout as it
// changes: a replica whose ranks are all there may still be half registered, and a plan made then
// would commit it with the rest of its tensors never written. Among complete replicas with the
// same number of ranks (the same model, sharded the same way), those holding fewer tensors than
// the most any holds are marked not complete, with `registering_of` set to that most.
void MarkRegistering(std::map<int, ReplicaView>* census);

// "replica 1 (rank 0 missing; agents lost: inference-1)", or for a replica MarkRegistering
// marked, "replica 1 (still registering: 1 of 2 tensors)".
std::string DescribeIncomplete(int replica, const ReplicaView& view, int ranks_per_replica);

// `agents` without the tensors of the inference replicas in `drop` (layouts copied only where
// they change).
std::vector<AgentRecord> WithoutReplicas(std::vector<AgentRecord> agents,
                                         const std::set<int>& drop);

// What each inference replica committed under this controller. Not thread-safe (the controller
// guards it).
class ReplicaLedger {
 public:
  // A step committed `version` to `replicas` (the others did not get it); `digests`: replica ->
  // its digest of the version (VersionChecks.digest; "" or absent: not digested).
  void Committed(uint64_t version, const std::vector<int>& replicas,
                 const std::map<int, std::string>& digests = {});
  // A rollback made `version` live again on `replica` (not a commit: staleness counts on).
  void RolledBack(int replica, uint64_t version);
  // The digest of the version the replica committed last ("": none).
  std::string digest(int replica) const;
  // Records that a replica exists (it shows up in layouts) so it is reported before it commits.
  void Saw(int replica);
  uint64_t committed_version(int replica) const;
  // Committed versions since the replica's own (all of them when it never committed).
  uint64_t Staleness(int replica) const;
  uint64_t latest() const { return latest_; }
  std::vector<int> Known() const;

  // The ledger as the controller keeps it in etcd (ControllerLedger), and back: a new leader
  // goes on counting staleness where the old one stopped.
  struct Entry {
    uint64_t version = 0;
    uint64_t commits_at = 0;  // commits_ when it last committed
    std::string digest;
  };
  const std::map<int, Entry>& entries() const { return entries_; }
  uint64_t commits() const { return commits_; }
  void Restore(std::map<int, Entry> entries, uint64_t commits);

 private:
  std::map<int, Entry> entries_;
  uint64_t commits_ = 0;
  uint64_t latest_ = 0;
};

}  // namespace wb::controller
