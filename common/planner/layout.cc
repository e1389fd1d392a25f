#include "common/planner/layout.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <unordered_map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::planner {

std::string FormatShape(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string FormatSlice(absl::Span<const DimSlice> shard, absl::Span<const int64_t> shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t start = shard.empty() ? 0 : (d < shard.size() ? shard[d].start : 0);
    int64_t size = shard.empty() ? shape[d] : (d < shard.size() ? shard[d].size : 0);
    absl::StrAppend(&out, d ? ", " : "", start, ":", start + size);
  }
  return out + "]";
}

std::string FormatOwner(const Owner& owner, const std::string& agent) {
  if (owner.role == Role::kTrainer) {
    if (owner.replica != 0) {
      return absl::StrCat("trainer replica ", owner.replica, " rank ", owner.rank, " on agent ",
                          agent);
    }
    return absl::StrCat("trainer rank ", owner.rank, " on agent ", agent);
  }
  return absl::StrCat("inference replica ", owner.replica, " rank ", owner.rank, " on agent ",
                      agent);
}

bool ParseLocation(const std::string& location, int32_t* gpu) {
  if (location == "host" || location.empty()) {
    *gpu = -1;
    return true;
  }
  if (location.rfind("cuda:", 0) != 0) return false;
  int32_t n = 0;
  if (!absl::SimpleAtoi(location.substr(5), &n) || n < 0) return false;
  *gpu = n;
  return true;
}

std::string FormatLocation(int32_t gpu) {
  return gpu < 0 ? std::string("host") : absl::StrCat("cuda:", gpu);
}

TensorEntry ResolvedEntry(const std::vector<AgentLayout>& agents, int32_t a, int32_t t) {
  TensorEntry e = EntryHolder(agents, a).tensors[t];
  if (agents[a].IsMirror()) {
    e.owner.replica += agents[a].mirror.replica_delta;
    e.region = EntryRegion(agents, a, t);
  }
  return e;
}

uint64_t EntryRegion(const std::vector<AgentLayout>& agents, int32_t a, int32_t t) {
  const Mirror& m = agents[a].mirror;
  if (m.of >= 0 && !m.regions.empty()) return m.regions[t];
  return EntryHolder(agents, a).tensors[t].region;
}

std::vector<AgentLayout> UnfoldMirrors(const std::vector<AgentLayout>& agents) {
  std::vector<AgentLayout> out;
  out.reserve(agents.size());
  for (size_t a = 0; a < agents.size(); ++a) {
    AgentLayout copy;
    copy.name = agents[a].name;
    copy.nics = agents[a].nics;
    if (!agents[a].IsMirror()) {
      copy.tensors = agents[a].tensors;
    } else {
      const size_t n = EntryCount(agents, static_cast<int32_t>(a));
      copy.tensors.reserve(n);
      for (size_t t = 0; t < n; ++t) {
        copy.tensors.push_back(
            ResolvedEntry(agents, static_cast<int32_t>(a), static_cast<int32_t>(t)));
      }
    }
    out.push_back(std::move(copy));
  }
  return out;
}

namespace {

bool SameExceptReplicaAndRegion(const TensorEntry& a, const TensorEntry& b) {
  if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape ||
      a.shard.size() != b.shard.size() || a.owner.role != b.owner.role ||
      a.owner.rank != b.owner.rank || a.region_bytes != b.region_bytes || a.gpu != b.gpu ||
      a.view.shape != b.view.shape || a.view.offset != b.view.offset ||
      a.view.buffer != b.view.buffer) {
    return false;
  }
  for (size_t d = 0; d < a.shard.size(); ++d) {
    if (a.shard[d].start != b.shard[d].start || a.shard[d].size != b.shard[d].size) return false;
  }
  return true;
}

bool AllInference(const AgentLayout& a) {
  for (const TensorEntry& e : a.tensors) {
    if (e.owner.role != Role::kInference) return false;
  }
  return true;
}

// The inference replicas a (non-mirror) agent holds.
std::set<int32_t> Replicas(const std::vector<AgentLayout>& agents, size_t a) {
  std::set<int32_t> out;
  int32_t last = 0;
  bool any = false;
  for (const TensorEntry& e : agents[a].tensors) {
    if (e.owner.role != Role::kInference || (any && e.owner.replica == last)) continue;
    out.insert(e.owner.replica);
    last = e.owner.replica, any = true;
  }
  return out;
}

}  // namespace

std::string MirrorProblem(const std::vector<AgentLayout>& agents) {
  bool any = false;
  std::vector<char> inference_only(agents.size(), -1);  // per template, computed once
  for (size_t a = 0; a < agents.size(); ++a) {
    const AgentLayout& m = agents[a];
    if (!m.IsMirror()) continue;
    any = true;
    const int32_t of = m.mirror.of;
    if (of >= static_cast<int32_t>(agents.size()) || of == static_cast<int32_t>(a)) {
      return absl::StrCat("agent ", m.name, " mirrors agent index ", of, ", which is not another ",
                          "agent of the plan");
    }
    const AgentLayout& t = agents[of];
    if (t.IsMirror()) {
      return absl::StrCat("agent ", m.name, " mirrors ", t.name, ", itself a mirror");
    }
    if (!m.tensors.empty()) {
      return absl::StrCat("agent ", m.name, " is a mirror of ", t.name, " but lists ",
                          m.tensors.size(), " tensors of its own");
    }
    if (!m.mirror.regions.empty() && m.mirror.regions.size() != t.tensors.size()) {
      return absl::StrCat("agent ", m.name, " mirrors ", t.name, "'s ", t.tensors.size(),
                          " tensors with ", m.mirror.regions.size(), " region ids");
    }
    if (inference_only[of] < 0) inference_only[of] = AllInference(t);
    if (m.mirror.replica_delta == 0 || !inference_only[of]) {
      return absl::StrCat("agent ", m.name, " mirrors ", t.name,
                          ": only inference agents mirror, for other replicas (shift ",
                          m.mirror.replica_delta, ")");
    }
  }
  if (!any) return "";
  // Each replica is held by templates only, or by mirrors of one shift whose templates are
  // exactly the holders of the unshifted replica: then it repeats that replica entry for entry.
  std::map<int32_t, std::vector<int32_t>> holders;
  std::vector<std::set<int32_t>> own(agents.size());  // each non-mirror's replicas, once
  for (size_t a = 0; a < agents.size(); ++a) {
    if (!agents[a].IsMirror()) own[a] = Replicas(agents, a);
  }
  for (size_t a = 0; a < agents.size(); ++a) {
    const bool mirror = agents[a].IsMirror();
    const int32_t delta = mirror ? agents[a].mirror.replica_delta : 0;
    for (int32_t r : own[mirror ? agents[a].mirror.of : a]) {
      holders[r + delta].push_back(static_cast<int32_t>(a));
    }
  }
  for (const auto& [replica, who] : holders) {
    const AgentLayout& first = agents[who.front()];
    if (!first.IsMirror()) {
      for (int32_t a : who) {
        if (agents[a].IsMirror()) {
          return absl::StrCat("inference replica ", replica, " is held by mirror ", agents[a].name,
                              " and by ", first.name, ", which is not one");
        }
      }
      continue;
    }
    const int32_t delta = first.mirror.replica_delta;
    std::vector<int32_t> templates;
    for (int32_t a : who) {
      if (!agents[a].IsMirror() || agents[a].mirror.replica_delta != delta) {
        return absl::StrCat("inference replica ", replica, " is held by ", first.name,
                            ", a mirror shifted by ", delta, ", and by ", agents[a].name,
                            ", which is not one of that shift");
      }
      templates.push_back(agents[a].mirror.of);
    }
    std::sort(templates.begin(), templates.end());
    auto it = holders.find(replica - delta);
    if (it == holders.end() || it->second != templates) {
      return absl::StrCat("inference replica ", replica, " (mirrors shifted by ", delta,
                          ") does not repeat replica ", replica - delta,
                          ": the mirrors' templates are not exactly that replica's agents");
    }
  }
  return "";
}

int FoldMirrors(std::vector<AgentLayout>* agents) {
  constexpr size_t kMaxTemplatesPerKey = 16;
  std::vector<AgentLayout>& v = *agents;
  // Candidates: non-mirror inference agents, keyed by what must match (entry count, first
  // entry's name); compared in full against the earliest candidate of the same key.
  std::unordered_map<uint64_t, std::vector<int32_t>> by_key;
  std::vector<int32_t> min_replica(v.size(), 0);
  std::vector<Mirror> folded(v.size());
  int count = 0;
  for (size_t b = 0; b < v.size(); ++b) {
    const AgentLayout& agent = v[b];
    if (agent.IsMirror() || agent.tensors.empty() || !AllInference(agent)) continue;
    int32_t lo = agent.tensors[0].owner.replica;
    for (const TensorEntry& e : agent.tensors) lo = std::min(lo, e.owner.replica);
    min_replica[b] = lo;
    const uint64_t key = (uint64_t{agent.tensors.size()} << 32) ^ agent.tensors[0].name.id();
    std::vector<int32_t>& earlier = by_key[key];
    // A few templates per key at most: the agents of one replica (different ranks, found
    // different at their first entry) are few, so this bounds the compares of agents that
    // repeat nothing.
    for (size_t c = 0; c < earlier.size() && c < kMaxTemplatesPerKey; ++c) {
      const int32_t a = earlier[c];
      if (folded[a].of >= 0) continue;  // a template is never a mirror itself
      const AgentLayout& t = v[a];
      const int32_t delta = lo - min_replica[a];
      if (delta == 0) continue;
      bool same = true;
      bool same_regions = true;
      for (size_t i = 0; i < t.tensors.size() && same; ++i) {
        same = agent.tensors[i].owner.replica - t.tensors[i].owner.replica == delta &&
               SameExceptReplicaAndRegion(agent.tensors[i], t.tensors[i]);
        same_regions &= agent.tensors[i].region == t.tensors[i].region;
      }
      if (!same) continue;
      folded[b].of = a;
      folded[b].replica_delta = delta;
      if (!same_regions) {
        folded[b].regions.reserve(agent.tensors.size());
        for (const TensorEntry& e : agent.tensors) folded[b].regions.push_back(e.region);
      }
      ++count;
      break;
    }
    if (folded[b].of < 0) earlier.push_back(static_cast<int32_t>(b));
  }
  if (count == 0) return 0;
  // Check the fold before applying it (the rule needs the templates' entries in place).
  std::vector<AgentLayout> probe(v.size());
  for (size_t a = 0; a < v.size(); ++a) {
    probe[a].name = v[a].name;
    if (folded[a].of >= 0) {
      probe[a].mirror = Mirror{folded[a].of, folded[a].replica_delta, {}};
    } else {
      probe[a].tensors.swap(v[a].tensors);
    }
  }
  const bool ok = MirrorProblem(probe).empty();
  for (size_t a = 0; a < v.size(); ++a) {
    if (folded[a].of < 0) v[a].tensors.swap(probe[a].tensors);
  }
  if (!ok) return 0;
  for (size_t a = 0; a < v.size(); ++a) {
    if (folded[a].of < 0) continue;
    v[a].mirror = std::move(folded[a]);
    std::vector<TensorEntry>().swap(v[a].tensors);
  }
  return count;
}

absl::Status CheckDeploymentGpus(int trainer_gpus, int inference_gpus) {
  if (trainer_gpus <= kMaxDeploymentGpus && inference_gpus <= kMaxDeploymentGpus) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(trainer_gpus, " trainer and ", inference_gpus,
                                                 " inference GPUs: at most ", kMaxDeploymentGpus,
                                                 " per side"));
}

}  // namespace wb::planner
