#include "controller/replica_census.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

bool SameOwner(const v1::Owner& a, const v1::Owner& b) {
  return a.role() == b.role() && a.replica() == b.replica() && a.rank() == b.rank();
}

std::map<int, ReplicaView> CensusReplicas(const std::vector<AgentRecord>& agents,
                                          int ranks_per_replica) {
  std::map<int, ReplicaView> out;
  for (const auto& a : agents) {
    const v1::Owner* last = nullptr;
    ReplicaView* view = nullptr;
    for (const auto& t : a.layout->tensors()) {
      if (t.owner().role() != v1::ROLE_INFERENCE) continue;
      // A process registers its tensors together: skip the map and set work (a string compare
      // per tensor, seconds for 10^6 of them on every Status) while the owner stays the same.
      if (!last || !SameOwner(*last, t.owner())) {
        last = &t.owner();
        view = &out[t.owner().replica()];
        if (a.lost) {
          view->lost_agents.insert(a.info.name());
        } else {
          view->agents.insert(a.info.name());
          view->ranks.insert(t.owner().rank());
        }
      }
      if (!a.lost) ++view->tensors;
    }
  }
  for (auto& [replica, v] : out) {
    const int want =
        ranks_per_replica > 0 ? ranks_per_replica : (v.ranks.empty() ? 1 : *v.ranks.rbegin() + 1);
    v.complete = true;
    for (int r = 0; r < want; ++r) v.complete = v.complete && v.ranks.count(r) > 0;
  }
  return out;
}

void MarkRegistering(std::map<int, ReplicaView>* census) {
  std::map<size_t, uint64_t> most;  // by number of ranks
  for (const auto& [k, v] : *census) {
    if (v.complete) most[v.ranks.size()] = std::max(most[v.ranks.size()], v.tensors);
  }
  for (auto& [k, v] : *census) {
    if (!v.complete || v.tensors >= most[v.ranks.size()]) continue;
    v.complete = false;
    v.registering_of = most[v.ranks.size()];
  }
}

std::string DescribeIncomplete(int replica, const ReplicaView& view, int ranks_per_replica) {
  if (view.registering_of > 0) {
    return absl::StrCat("replica ", replica, " (still registering: ", view.tensors, " of ",
                        view.registering_of, " tensors)");
  }
  const int want = std::max(1, ranks_per_replica);
  std::vector<std::string> missing;
  for (int r = 0; r < want; ++r) {
    if (!view.ranks.count(r)) missing.push_back(absl::StrCat(r));
  }
  std::string out =
      absl::StrCat("replica ", replica, " (rank ", absl::StrJoin(missing, ", "), " missing");
  if (!view.lost_agents.empty()) {
    absl::StrAppend(&out, "; agent ", absl::StrJoin(view.lost_agents, ", "),
                    " lost (no heartbeat)");
  }
  return out + ")";
}

std::vector<AgentRecord> WithoutReplicas(std::vector<AgentRecord> agents,
                                         const std::set<int>& drop) {
  if (drop.empty()) return agents;
  auto dropped = [&](const v1::TensorLayout& t) {
    return t.owner().role() == v1::ROLE_INFERENCE && drop.count(t.owner().replica()) > 0;
  };
  for (auto& a : agents) {
    const auto& tensors = a.layout->tensors();
    if (std::none_of(tensors.begin(), tensors.end(), dropped)) continue;
    auto copy = std::make_shared<v1::AgentLayout>(*a.layout);
    copy->clear_tensors();
    for (const auto& t : tensors) {
      if (!dropped(t)) *copy->add_tensors() = t;
    }
    a.layout = std::move(copy);
  }
  return agents;
}

void ReplicaLedger::Committed(uint64_t version, const std::vector<int>& replicas,
                              const std::map<int, std::string>& digests) {
  ++commits_;
  latest_ = std::max(latest_, version);
  for (int r : replicas) {
    auto d = digests.find(r);
    entries_[r] = Entry{version, commits_, d == digests.end() ? "" : d->second};
  }
}

void ReplicaLedger::RolledBack(int replica, uint64_t version) {
  Entry& e = entries_[replica];
  e.version = version;
  e.digest.clear();  // the rolled-back version's digest is not known here
}

std::string ReplicaLedger::digest(int replica) const {
  auto it = entries_.find(replica);
  return it == entries_.end() ? "" : it->second.digest;
}

void ReplicaLedger::Saw(int replica) { entries_.emplace(replica, Entry{}); }

uint64_t ReplicaLedger::committed_version(int replica) const {
  auto it = entries_.find(replica);
  return it == entries_.end() ? 0 : it->second.version;
}

uint64_t ReplicaLedger::Staleness(int replica) const {
  auto it = entries_.find(replica);
  return commits_ - (it == entries_.end() ? 0 : it->second.commits_at);
}

void ReplicaLedger::Restore(std::map<int, Entry> entries, uint64_t commits) {
  entries_ = std::move(entries);
  commits_ = commits;
  latest_ = 0;
  for (const auto& [r, e] : entries_) latest_ = std::max(latest_, e.version);
}

std::vector<int> ReplicaLedger::Known() const {
  std::vector<int> out;
  for (const auto& [r, e] : entries_) out.push_back(r);
  return out;
}

}  // namespace wb::controller
