#include "common/engines/dry_run.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/planner/relay.h"

namespace wb::engines {
namespace {

std::string AgentName(const char* prefix, int index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s-%03d", prefix, index);
  return buf;
}

int64_t Volume(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The most entries the layouts may hold: kMaxLayoutEntries, and no more than half this
// machine's memory can take (the vectors grow by doubling).
uint64_t MaxEntries() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return planner::kMaxLayoutEntries;
  const uint64_t fit = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2 /
                       (2 * sizeof(planner::TensorEntry));
  return std::min(fit, planner::kMaxLayoutEntries);
}

// Agents for `gpus` GPUs, `per_agent` each, each with `nics` rails.
std::vector<planner::AgentLayout> Agents(const char* prefix, int gpus, const DeploymentOptions& o) {
  std::vector<planner::AgentLayout> out((gpus + o.gpus_per_agent - 1) / o.gpus_per_agent);
  for (size_t a = 0; a < out.size(); ++a) {
    out[a].name = AgentName(prefix, static_cast<int>(a));
    for (int n = 0; n < o.nics_per_agent; ++n) {
      out[a].nics.push_back({absl::StrCat("nic", n), o.nic_gbps});
    }
  }
  return out;
}

// Megatron ranks as trainer entries: every part a view of its trainer tensor (one region per
// tensor), a tensor with one part filling it dense. Ranks with the same (tp, pp, ep, etp)
// ranks (data-parallel copies) share one computed layout.
absl::Status MegatronEntries(const ModelConfig& config, const DeploymentOptions& o,
                             uint64_t max_entries, uint64_t* region, uint64_t* entries,
                             std::vector<planner::AgentLayout>* trainers) {
  const MegatronOptions& m = o.megatron;
  if (m.tp * m.dp % (m.ep * m.etp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("megatron: ep ", m.ep, " x etp ", m.etp,
                                                   " must divide tp ", m.tp, " x dp ", m.dp,
                                                   " (a stage's ranks regrouped for the experts)"));
  }
  std::vector<std::vector<int64_t>> stages;
  if (!o.stage_layer_counts.empty()) {
    int64_t next = 0;
    for (int64_t n : o.stage_layer_counts) {
      stages.emplace_back();
      for (int64_t k = 0; k < n && k < config.layers; ++k) stages.back().push_back(next++);
    }
    if (static_cast<int>(stages.size()) != m.pp || next != config.layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "megatron: ", o.stage_layer_counts.size(), " stage layer counts adding up to ", next,
          "; pp ", m.pp, " stages of the ", config.layers, " layers expected"));
    }
  }
  std::map<std::tuple<int, int, int, int>, std::vector<TrainerTensor>> layouts;
  for (int d = 0; d < m.dp; ++d) {
    for (int p = 0; p < m.pp; ++p) {
      for (int t = 0; t < m.tp; ++t) {
        const int rank = (d * m.pp + p) * m.tp + t;
        const int i = d * m.tp + t;
        MegatronOptions r = m;
        r.tp_rank = t, r.pp_rank = p, r.dp_rank = d;
        if (!stages.empty()) {
          r.stage_layers_given = true;
          r.stage_layers = stages[p];
        }
        r.etp_rank = i % m.etp;
        r.ep_rank = (i / m.etp) % m.ep;
        auto [it, fresh] = layouts.try_emplace({t, p, r.ep_rank, r.etp_rank});
        if (fresh) {
          absl::StatusOr<std::vector<TrainerTensor>> l = MegatronLayout(config, r);
          if (!l.ok()) return l.status();
          it->second = *std::move(l);
        }
        std::vector<planner::TensorEntry>& held = (*trainers)[rank / o.gpus_per_agent].tensors;
        for (const TrainerTensor& tensor : it->second) {
          const uint64_t bytes = Volume(tensor.shape) * planner::DTypeBytes(tensor.dtype);
          const bool view = !FillsTensor(tensor);  // else a plain shard of its HF tensor
          for (const ParamPart& part : tensor.parts) {
            planner::TensorEntry e;
            e.name = part.source;
            e.dtype = tensor.dtype;
            e.shape = part.source_shape;
            e.shard = part.box;
            if (view) {
              e.view.shape = tensor.shape;
              e.view.offset = part.offset;
              e.view.buffer = tensor.name;
            }
            e.owner = {planner::Role::kTrainer, rank, 0};
            e.region = *region;
            e.region_bytes = bytes;
            e.gpu = rank % o.gpus_per_agent;
            held.push_back(std::move(e));
            if (++*entries > max_entries) {
              return absl::ResourceExhaustedError(absl::StrCat(
                  "the trainers' layouts would hold more than ", max_entries, " tensor entries"));
            }
          }
          ++*region;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainerDialect> ParseTrainerDialect(absl::string_view name) {
  if (name == "fsdp") return TrainerDialect::kFsdp;
  if (name == "megatron") return TrainerDialect::kMegatron;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown trainer '", name, "'; expected fsdp or megatron"));
}

absl::StatusOr<std::vector<planner::AgentLayout>> DeploymentLayouts(
    const ModelConfig& config, const DeploymentOptions& options) {
  DeploymentOptions o = options;
  if (o.trainer == TrainerDialect::kMegatron) {
    const MegatronOptions& m = o.megatron;
    if (m.tp < 1 || m.pp < 1 || m.dp < 1 || m.ep < 1 || m.etp < 1 ||
        static_cast<int64_t>(m.tp) * m.pp * m.dp > planner::kMaxDeploymentGpus) {
      return absl::InvalidArgumentError(absl::StrCat(
          "megatron tp ", m.tp, ", pp ", m.pp, ", ep ", m.ep, ", etp ", m.etp, ", dp ", m.dp,
          ": each at least 1, tp x pp x dp at most ", planner::kMaxDeploymentGpus));
    }
    o.trainers = m.tp * m.pp * m.dp;
  }
  if (o.trainers < 1 || o.inference_gpus < 1 || o.tp < 1 || o.gpus_per_agent < 1) {
    return absl::InvalidArgumentError(
        "trainers, inference GPUs, tp and GPUs per node must be >= 1");
  }
  if (o.nics_per_agent < 1 || !(o.nic_gbps > 0) || !std::isfinite(o.nic_gbps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("every node needs at least one NIC of a positive rate (", o.nics_per_agent,
                     " NIC(s) of ", o.nic_gbps, " GB/s)"));
  }
  if (absl::Status s = planner::CheckDeploymentGpus(o.trainers, o.inference_gpus); !s.ok()) {
    return s;
  }
  if (o.inference_gpus % o.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp ", o.tp, " does not divide the ", o.inference_gpus, " inference GPUs"));
  }
  const int replicas = o.inference_gpus / o.tp;
  // vLLM EP beyond tp: consecutive groups of ep / tp replicas form one EP group.
  const int dp = o.engine == Engine::kVllm && o.ep > o.tp ? o.ep / o.tp : 1;
  if (replicas % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("vllm ep ", o.ep, " needs the ", replicas,
                                                   " replicas in groups of ", dp, " (ep / tp)"));
  }
  uint64_t region = 1;

  uint64_t entries = 0;  // held so far
  const uint64_t max_entries = MaxEntries();
  auto too_many = [&] {
    return absl::ResourceExhaustedError(
        absl::StrCat("the deployment's layouts would hold more than ", max_entries,
                     " tensor entries (", o.trainers, " trainer and ", o.inference_gpus,
                     " inference GPUs), more than this machine's memory takes; plan fewer GPUs"));
  };
  std::vector<planner::AgentLayout> trainers = Agents("trainer", o.trainers, o);
  if (o.trainer == TrainerDialect::kMegatron) {
    if (absl::Status st = MegatronEntries(config, o, max_entries, &region, &entries, &trainers);
        !st.ok()) {
      return st;
    }
  }
  const std::vector<SourceTensor> sources =
      o.trainer == TrainerDialect::kFsdp ? SourceTensors(config) : std::vector<SourceTensor>();
  const bool whole_small = o.fp8 && o.fp8_whole_small;
  const std::vector<int> first_ranks =
      FsdpFirstRanks(sources, o.trainers, o.align_rows, whole_small);
  for (size_t i = 0; i < sources.size(); ++i) {
    const SourceTensor& t = sources[i];
    const int64_t row_elems = Volume(t.shape) / t.shape[0];
    const planner::TensorName name(t.name);  // interned once for all trainers
    for (int r = 0; r < o.trainers; ++r) {
      DimSlice rows =
          FsdpRows(t.shape[0], o.trainers, r, o.align_rows, first_ranks[i], whole_small);
      if (rows.size == 0) continue;
      planner::TensorEntry e;
      e.name = name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.shard.push_back(rows);
      for (size_t d = 1; d < t.shape.size(); ++d) e.shard.push_back({0, t.shape[d]});
      e.owner = {planner::Role::kTrainer, r, 0};
      e.region = region++;
      e.region_bytes = rows.size * row_elems * planner::DTypeBytes(t.dtype);
      e.gpu = r % o.gpus_per_agent;
      trainers[r / o.gpus_per_agent].tensors.push_back(std::move(e));
      if (++entries > max_entries) return too_many();
    }
  }

  // Every replica's rank r with the same EP rank holds the same parameters: each distinct rank
  // is laid out (and its names interned) for the first replica that holds it, and later
  // replicas copy those entries, with their own owner, GPU and region ids (numbered per
  // parameter, in order).
  struct LaidOut {
    int agent = 0;     // where the first replica's entries are: inference[agent].tensors,
    size_t first = 0;  // [first, first + count)
    size_t count = 0;
    std::vector<uint64_t> param;  // per entry: its parameter's index on the rank
    uint64_t params = 0;
  };
  std::map<std::pair<int, int>, LaidOut> laid_out;  // by (tp rank, ep rank)
  std::vector<planner::AgentLayout> inference = Agents("infer", o.inference_gpus, o);
  // With mirror_replicas, a full agent `period` GPUs (whole agents and whole EP groups of
  // replicas) after another holds its entries for replicas shifted by period / tp.
  const int period = std::lcm(o.gpus_per_agent, o.tp * dp);
  for (int k = 0; k < replicas; ++k) {
    for (int r = 0; r < o.tp; ++r) {
      const int ep_rank = dp > 1 ? (k % dp) * o.tp + r : -1;
      const int gpu = k * o.tp + r;
      const int agent = gpu / o.gpus_per_agent;
      const int g0 = agent * o.gpus_per_agent;
      if (o.mirror_replicas && g0 >= period && g0 + o.gpus_per_agent <= o.inference_gpus) {
        planner::Mirror& m = inference[agent].mirror;
        if (m.of < 0) {
          m.of = (g0 % period) / o.gpus_per_agent;
          m.replica_delta = (g0 - g0 % period) / o.tp;
        }
        // Laid out already: the template's GPU (gpu - g0 + g0 % period) came first.
        const LaidOut& rank = laid_out.at({r, ep_rank});
        for (size_t i = 0; i < rank.count; ++i) m.regions.push_back(region + rank.param[i]);
        region += rank.params;
        continue;
      }
      std::vector<planner::TensorEntry>& held = inference[agent].tensors;
      const size_t first = held.size();
      auto [it, fresh] = laid_out.try_emplace({r, ep_rank});
      if (!fresh && entries + it->second.count > max_entries) return too_many();
      LaidOut& rank = it->second;
      if (fresh) {
        EngineOptions eo{o.engine, o.tp, r, o.ep, ep_rank, o.fp8};
        absl::StatusOr<std::vector<EngineParam>> params = EngineLayout(config, eo);
        if (!params.ok()) return params.status();
        for (const EngineParam& p : *params) {
          const planner::TensorName buffer(p.name);
          for (const ParamPart& part : p.parts) {
            planner::TensorEntry e;
            e.name = part.source;
            e.dtype = p.dtype;
            e.shape = part.source_shape;
            e.shard = part.box;
            e.view.shape = p.shape;
            e.view.offset = part.offset;
            e.view.buffer = buffer;
            e.region_bytes = Volume(p.shape) * planner::DTypeBytes(p.dtype);
            held.push_back(std::move(e));
            rank.param.push_back(rank.params);
          }
          ++rank.params;
        }
        rank.agent = agent;
        rank.first = first;
        rank.count = held.size() - first;
      } else {
        // By index: the source may be this same vector (an agent holding several replicas);
        // push_back copes with its argument living in the vector it grows.
        const std::vector<planner::TensorEntry>& from = inference[rank.agent].tensors;
        for (size_t i = 0; i < rank.count; ++i) held.push_back(from[rank.first + i]);
      }
      for (size_t i = first; i < held.size(); ++i) {
        planner::TensorEntry& e = held[i];
        e.owner = {planner::Role::kInference, r, k};
        e.region = region + rank.param[i - first];
        e.gpu = gpu % o.gpus_per_agent;
      }
      region += rank.params;
      entries += held.size() - first;
      if (entries > max_entries) return too_many();
    }
  }
  const int32_t base = static_cast<int32_t>(trainers.size());
  for (auto& a : inference) {
    if (a.IsMirror()) a.mirror.of += base;
    trainers.push_back(std::move(a));
  }
  // A partial last agent can leave a replica held by a mirror and a full agent, which the
  // planner refuses: then every entry is held, as without mirror_replicas.
  if (o.mirror_replicas && !planner::MirrorProblem(trainers).empty()) {
    uint64_t all = entries;
    for (const auto& a : trainers) all += a.mirror.regions.size();
    if (all > max_entries) return too_many();
    return planner::UnfoldMirrors(trainers);
  }
  return trainers;
}

std::vector<NicLoad> SenderNicLoads(const std::vector<planner::AgentLayout>& agents,
                                    const planner::Plan& plan) {
  std::vector<NicLoad> out;
  for (size_t a = 0; a < plan.ops.size() && a < agents.size(); ++a) {
    if (plan.ops[a].empty()) continue;
    std::vector<NicLoad> rails(std::max<size_t>(agents[a].nics.size(), 1));
    for (size_t n = 0; n < rails.size(); ++n) {
      rails[n].agent = agents[a].name;
      rails[n].nic = n < agents[a].nics.size() ? agents[a].nics[n].name : "nic0";
    }
    // What the sender sends itself: with relays, later replicas get theirs from a relay.
    planner::ForEachSentOp(plan, static_cast<int32_t>(a), [&](const planner::PlannedOp& op) {
      NicLoad& l = rails[static_cast<size_t>(op.rail) % rails.size()];
      l.bytes += op.DstBytes();
      ++l.ops;
    });
    for (NicLoad& l : rails) out.push_back(std::move(l));
  }
  return out;
}

}  // namespace wb::engines
