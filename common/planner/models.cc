#include "common/planner/models.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace wb::planner {
namespace {

using weightbeam::v1::DTYPE_BF16;
using weightbeam::v1::DTYPE_F32;
using weightbeam::v1::DTYPE_F8_E4M3;

void Add(ModelSpec* m, std::string name, std::vector<int64_t> shape, TpStyle tp, bool fp8,
         int expert = -1, DType dtype = DTYPE_BF16) {
  m->tensors.push_back(ModelTensor{std::move(name), std::move(shape), dtype, tp, fp8, expert});
}

void AddMlp(ModelSpec* m, const std::string& p, int64_t hidden, int64_t inter, int expert) {
  Add(m, p + "gate_proj.weight", {inter, hidden}, TpStyle::kColumn, true, expert);
  Add(m, p + "up_proj.weight", {inter, hidden}, TpStyle::kColumn, true, expert);
  Add(m, p + "down_proj.weight", {hidden, inter}, TpStyle::kRow, true, expert);
}

// Dim-0 cuts for `rows` over n ranks aligned to 128 rows; `cursor` rotates which ranks get
// the extra blocks. Returns (rank, start, size) for the ranks holding something.
struct Cut {
  int rank;
  int64_t start;
  int64_t size;
};
std::vector<Cut> SplitRows(int64_t rows, int n, int* cursor) {
  std::vector<Cut> cuts;
  const int64_t blocks = (rows + kFp8Block - 1) / kFp8Block;
  if (blocks >= n) {
    const int64_t base = blocks / n, extra = blocks % n;
    int64_t start = 0;
    for (int i = 0; i < n; ++i) {
      int64_t b = base + (((i - *cursor) % n + n) % n < extra ? 1 : 0);
      int64_t size = std::min(rows - start, b * kFp8Block);
      cuts.push_back(Cut{i, start, size});
      start += size;
    }
    *cursor = static_cast<int>((*cursor + extra) % n);
  } else {
    for (int64_t j = 0; j < blocks; ++j) {
      int64_t start = j * kFp8Block;
      cuts.push_back(Cut{static_cast<int>((*cursor + j) % n), start,
                         std::min<int64_t>(kFp8Block, rows - start)});
    }
    *cursor = static_cast<int>((*cursor + blocks) % n);
  }
  return cuts;
}

// The agents of one side ("trainer-0000", ...), one per `gpus_per_agent` GPUs.
struct AgentBuilder {
  std::vector<AgentLayout>* agents;
  const char* prefix;
  int gpus_per_agent, nics;
  double gbps;
  std::vector<int> node_agent;        // node -> index in *agents; -1 until created
  std::vector<uint64_t> next_region;  // per index in *agents

  // The agent holding global GPU `gpu` of the side, created on first use.
  int For(int gpu) {
    const size_t node = static_cast<size_t>(gpu / gpus_per_agent);
    if (node >= node_agent.size() || node_agent[node] < 0) Add(node, Mirror{});
    return node_agent[node];
  }

  // Node `node` repeats node `of` (created already) for replicas shifted by `delta`, in the
  // same region ids: they are numbered per agent alike.
  void AddMirror(size_t node, size_t of, int32_t delta) {
    Add(node, Mirror{node_agent[of], delta, {}});
  }

  // Creates node `node`'s agent (a mirror when mirror.of >= 0).
  void Add(size_t node, Mirror mirror) {
    if (node >= node_agent.size()) node_agent.resize(node + 1, -1);
    node_agent[node] = static_cast<int>(agents->size());
    AgentLayout a;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s-%04zu", prefix, node);
    a.name = buf;
    for (int k = 0; k < nics; ++k) a.nics.push_back(Nic{absl::StrCat("mlx5_", k), gbps});
    a.mirror = std::move(mirror);
    agents->push_back(std::move(a));
    next_region.resize(agents->size(), 1);
  }

  void AddTensor(int gpu, TensorEntry t) {
    const int idx = For(gpu);
    AgentLayout& a = (*agents)[idx];
    t.gpu = gpu % gpus_per_agent;
    t.region = next_region[idx]++;
    int64_t elems = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      elems *= t.shard.empty() ? t.shape[d] : t.shard[d].size;
    }
    t.region_bytes = static_cast<uint64_t>(elems * DTypeBytes(t.dtype));
    a.tensors.push_back(std::move(t));
  }
};

EntryShard Slice1(absl::Span<const int64_t> shape, int dim, int64_t start, int64_t size) {
  EntryShard s;
  for (size_t d = 0; d < shape.size(); ++d) {
    s.push_back(static_cast<int>(d) == dim ? DimSlice{start, size} : DimSlice{0, shape[d]});
  }
  return s;
}

// Applies fusion rules: parts are replaced by one fused tensor at the first part's position.
std::vector<ModelTensor> FuseForInference(const std::vector<ModelTensor>& in,
                                          const std::vector<FusionRule>& rules) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < in.size(); ++i) by_name[in[i].name] = i;
  std::vector<bool> consumed(in.size(), false);
  std::vector<ModelTensor> out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (consumed[i]) continue;
    const ModelTensor& t = in[i];
    bool fused = false;
    for (const FusionRule& r : rules) {
      const std::string& first = r.parts.front();
      if (t.name.size() < first.size() ||
          t.name.compare(t.name.size() - first.size(), first.size(), first) != 0) {
        continue;
      }
      std::string prefix = t.name.substr(0, t.name.size() - first.size());
      std::vector<size_t> parts;
      for (const std::string& p : r.parts) {
        auto it = by_name.find(prefix + p);
        if (it != by_name.end()) parts.push_back(it->second);
      }
      if (parts.size() != r.parts.size()) continue;
      ModelTensor f = t;
      f.name = prefix + r.fused;
      f.shape[r.dim] = 0;
      for (size_t p : parts) {
        f.shape[r.dim] += in[p].shape[r.dim];
        consumed[p] = true;
      }
      out.push_back(std::move(f));
      fused = true;
      break;
    }
    if (!fused) out.push_back(t);
  }
  return out;
}

}  // namespace

uint64_t ModelSpec::Params() const {
  uint64_t n = 0;
  for (const ModelTensor& t : tensors) {
    uint64_t e = 1;
    for (int64_t s : t.shape) e *= s;
    n += e;
  }
  return n;
}

Qwen3Config Qwen3_0_6B() { return Qwen3Config{}; }

Qwen3Config Qwen3_235B_A22B() {
  Qwen3Config c;
  c.hidden = 4096, c.layers = 94, c.heads = 64, c.kv_heads = 4, c.head_dim = 128;
  c.intermediate = 12288, c.vocab = 151936, c.tied_embeddings = false;
  c.experts = 128, c.moe_intermediate = 1536;
  return c;
}

DeepSeekV3Config KimiK2() { return DeepSeekV3Config{}; }

ModelSpec BuildQwen3(const std::string& name, const Qwen3Config& c) {
  ModelSpec m;
  m.name = name;
  m.num_experts = c.experts;
  const int64_t h = c.hidden, q = int64_t{c.heads} * c.head_dim,
                kv = int64_t{c.kv_heads} * c.head_dim;
  Add(&m, "model.embed_tokens.weight", {c.vocab, h}, TpStyle::kColumn, false);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    Add(&m, p + "input_layernorm.weight", {h}, TpStyle::kReplicated, false);
    Add(&m, p + "self_attn.q_proj.weight", {q, h}, TpStyle::kColumn, true);
    Add(&m, p + "self_attn.k_proj.weight", {kv, h}, TpStyle::kColumn, true);
    Add(&m, p + "self_attn.v_proj.weight", {kv, h}, TpStyle::kColumn, true);
    Add(&m, p + "self_attn.o_proj.weight", {h, q}, TpStyle::kRow, true);
    Add(&m, p + "self_attn.q_norm.weight", {c.head_dim}, TpStyle::kReplicated, false);
    Add(&m, p + "self_attn.k_norm.weight", {c.head_dim}, TpStyle::kReplicated, false);
    Add(&m, p + "post_attention_layernorm.weight", {h}, TpStyle::kReplicated, false);
    if (c.experts > 0) {
      Add(&m, p + "mlp.gate.weight", {c.experts, h}, TpStyle::kReplicated, false);
      for (int e = 0; e < c.experts; ++e) {
        AddMlp(&m, absl::StrCat(p, "mlp.experts.", e, "."), h, c.moe_intermediate, e);
      }
    } else {
      AddMlp(&m, p + "mlp.", h, c.intermediate, -1);
    }
  }
  Add(&m, "model.norm.weight", {h}, TpStyle::kReplicated, false);
  if (!c.tied_embeddings) Add(&m, "lm_head.weight", {c.vocab, h}, TpStyle::kColumn, false);
  return m;
}

ModelSpec BuildDeepSeekV3(const std::string& name, const DeepSeekV3Config& c) {
  ModelSpec m;
  m.name = name;
  m.num_experts = c.experts;
  const int64_t h = c.hidden;
  const int64_t qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
  Add(&m, "model.embed_tokens.weight", {c.vocab, h}, TpStyle::kColumn, false);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string a = p + "self_attn.";
    Add(&m, p + "input_layernorm.weight", {h}, TpStyle::kReplicated, false);
    Add(&m, a + "q_a_proj.weight", {c.q_lora_rank, h}, TpStyle::kReplicated, true);
    Add(&m, a + "q_a_layernorm.weight", {c.q_lora_rank}, TpStyle::kReplicated, false);
    Add(&m, a + "q_b_proj.weight", {int64_t{c.heads} * qk_head, c.q_lora_rank}, TpStyle::kColumn,
        true);
    Add(&m, a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h},
        TpStyle::kReplicated, true);
    Add(&m, a + "kv_a_layernorm.weight", {c.kv_lora_rank}, TpStyle::kReplicated, false);
    Add(&m, a + "kv_b_proj.weight",
        {int64_t{c.heads} * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, TpStyle::kColumn,
        true);
    Add(&m, a + "o_proj.weight", {h, int64_t{c.heads} * c.v_head_dim}, TpStyle::kRow, true);
    Add(&m, p + "post_attention_layernorm.weight", {h}, TpStyle::kReplicated, false);
    if (l < c.dense_layers) {
      AddMlp(&m, p + "mlp.", h, c.intermediate, -1);
      continue;
    }
    Add(&m, p + "mlp.gate.weight", {c.experts, h}, TpStyle::kReplicated, false);
    Add(&m, p + "mlp.gate.e_score_correction_bias", {c.experts}, TpStyle::kReplicated, false, -1,
        DTYPE_F32);
    for (int e = 0; e < c.experts; ++e) {
      AddMlp(&m, absl::StrCat(p, "mlp.experts.", e, "."), h, c.moe_intermediate, e);
    }
    AddMlp(&m, p + "mlp.shared_experts.", h, int64_t{c.moe_intermediate} * c.shared_experts, -1);
  }
  Add(&m, "model.norm.weight", {h}, TpStyle::kReplicated, false);
  Add(&m, "lm_head.weight", {c.vocab, h}, TpStyle::kColumn, false);
  return m;
}

absl::StatusOr<ModelSpec> ModelByName(const std::string& name) {
  if (name == "qwen3-0.6b") return BuildQwen3(name, Qwen3_0_6B());
  if (name == "qwen3-235b") return BuildQwen3(name, Qwen3_235B_A22B());
  if (name == "kimi-k2") return BuildDeepSeekV3(name, KimiK2());
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model ", name, " (known: qwen3-0.6b, qwen3-235b, kimi-k2)"));
}

absl::StatusOr<std::vector<AgentLayout>> BuildLayouts(const ModelSpec& model,
                                                      const TrainerOptions& tr,
                                                      const InferenceOptions& inf) {
  if (tr.ranks <= 0 || tr.replicas <= 0 || tr.ranks % tr.replicas != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer ranks ", tr.ranks, " must be a positive multiple of replicas ", tr.replicas));
  }
  if (absl::Status s = CheckDeploymentGpus(tr.ranks, inf.gpus); !s.ok()) return s;
  const int per_replica = tr.ranks / tr.replicas;
  if (tr.ep <= 0 || per_replica % tr.ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer ep ", tr.ep, " must divide the ranks per replica ", per_replica));
  }
  if (inf.tp <= 0 || inf.gpus <= 0 || inf.gpus % inf.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference gpus ", inf.gpus, " must be a positive multiple of tp ", inf.tp));
  }
  if (inf.ep <= 0 || inf.tp % inf.ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference ep ", inf.ep, " must divide tp ", inf.tp));
  }
  for (const auto& [side, gpus, nics, gbps] :
       {std::tuple{"trainer", tr.gpus_per_agent, tr.nics_per_agent, tr.nic_gbps},
        std::tuple{"inference", inf.gpus_per_agent, inf.nics_per_agent, inf.nic_gbps}}) {
    if (gpus <= 0 || nics <= 0 || !(gbps > 0) || !std::isfinite(gbps)) {
      return absl::InvalidArgumentError(
          absl::StrCat(side, " agents need at least one GPU and one NIC of a positive rate (", gpus,
                       " GPU(s), ", nics, " NIC(s) of ", gbps, " GB/s per agent)"));
    }
  }
  std::vector<AgentLayout> agents;
  AgentBuilder trainers{&agents, "trainer", tr.gpus_per_agent, tr.nics_per_agent, tr.nic_gbps,
                        {},      {}};
  const int experts = std::max(1, model.num_experts);

  // Trainers: the same cuts in every replica, so replicas are interchangeable sources.
  const int group = per_replica / tr.ep;
  std::vector<int> cursors(tr.ep + 1, 0);
  for (const ModelTensor& t : model.tensors) {
    const bool ep = t.expert >= 0 && tr.ep > 1;
    const int g = ep ? static_cast<int>(int64_t{t.expert} * tr.ep / experts) : 0;
    const int n = ep ? group : per_replica;
    const int base = ep ? g * group : 0;
    int* cursor = &cursors[ep ? g : tr.ep];
    const TensorName name(t.name);  // interned once, copied into every entry
    for (const Cut& c : SplitRows(t.shape[0], n, cursor)) {
      for (int r = 0; r < tr.replicas; ++r) {
        TensorEntry e;
        e.name = name;
        e.dtype = t.dtype;
        e.shape = t.shape;
        e.shard = Slice1(t.shape, 0, c.start, c.size);
        e.owner = Owner{Role::kTrainer, r * per_replica + base + c.rank, r};
        trainers.AddTensor(r * per_replica + base + c.rank, std::move(e));
      }
    }
  }

  AgentBuilder infer{&agents, "infer", inf.gpus_per_agent, inf.nics_per_agent, inf.nic_gbps,
                     {},      {}};
  const std::vector<ModelTensor> fused = FuseForInference(model.tensors, inf.fusions);
  // Names interned once, not once per replica.
  std::vector<TensorName> names, scale_names;
  for (const ModelTensor& t : fused) {
    names.emplace_back(t.name);
    scale_names.emplace_back(ScaleTensorName(t.name));
  }
  const int replicas = inf.gpus / inf.tp;
  const int ep_group = inf.tp / inf.ep;
  // With mirrors, only the first period of whole agents and whole replicas is built; every
  // later node mirrors the node one or more periods before it.
  const int period_gpus = std::lcm(inf.tp, inf.gpus_per_agent);
  const int period_replicas = period_gpus / inf.tp;
  const bool mirror =
      inf.mirror_replicas && replicas > period_replicas && replicas % period_replicas == 0;
  const int built = mirror ? period_replicas : replicas;
  for (int rep = 0; rep < built; ++rep) {
    for (size_t ti = 0; ti < fused.size(); ++ti) {
      const ModelTensor& t = fused[ti];
      // Ranks holding this tensor and how they split it.
      int first = 0, n = inf.tp;
      if (t.expert >= 0 && inf.ep > 1) {
        first = static_cast<int>(int64_t{t.expert} * inf.ep / experts) * ep_group;
        n = ep_group;
      }
      int dim = t.tp == TpStyle::kColumn ? 0 : (t.tp == TpStyle::kRow ? 1 : -1);
      if (dim >= static_cast<int>(t.shape.size())) dim = -1;
      // Fewer 128-blocks than ranks: replicate (like KV heads under a large TP).
      if (dim >= 0 && (t.shape[dim] + kFp8Block - 1) / kFp8Block < n) dim = -1;
      const bool fp8 = inf.fp8 && t.fp8 && t.shape.size() == 2;
      int cursor = 0;
      std::vector<Cut> cuts;
      if (dim >= 0) {
        cuts = SplitRows(t.shape[dim], n, &cursor);
      } else {
        for (int i = 0; i < n; ++i) cuts.push_back(Cut{i, 0, t.shape[0]});
      }
      const TensorName name = names[ti], scale_name = scale_names[ti];
      for (const Cut& c : cuts) {
        const int gpu = rep * inf.tp + first + c.rank;
        TensorEntry e;
        e.name = name;
        e.dtype = fp8 ? DTYPE_F8_E4M3 : t.dtype;
        e.shape = t.shape;
        if (dim >= 0) e.shard = Slice1(t.shape, dim, c.start, c.size);
        e.owner = Owner{Role::kInference, first + c.rank, rep};
        if (fp8) {
          TensorEntry s;
          s.name = scale_name;
          s.dtype = DTYPE_F32;
          s.shape = {(t.shape[0] + kFp8Block - 1) / kFp8Block,
                     (t.shape[1] + kFp8Block - 1) / kFp8Block};
          if (dim >= 0) {
            int64_t lo = c.start / kFp8Block, hi = (c.start + c.size + kFp8Block - 1) / kFp8Block;
            s.shard = Slice1(s.shape, dim, lo, hi - lo);
          }
          s.owner = e.owner;
          infer.AddTensor(gpu, std::move(e));
          infer.AddTensor(gpu, std::move(s));
        } else {
          infer.AddTensor(gpu, std::move(e));
        }
      }
    }
  }
  if (mirror) {
    const size_t period_nodes = static_cast<size_t>(period_gpus / inf.gpus_per_agent);
    const size_t nodes = static_cast<size_t>(inf.gpus / inf.gpus_per_agent);
    for (size_t node = period_nodes; node < nodes; ++node) {
      infer.AddMirror(node, node % period_nodes,
                      static_cast<int32_t>(node / period_nodes) * period_replicas);
    }
  }
  return agents;
}

}  // namespace wb::planner
