// DeploymentLayouts (the dry run's whole-deployment layouts) lays each distinct engine rank out
// once and copies it for the other replicas. Checked here against the plain construction: every
// inference GPU's entries straight from EngineLayout for its (tp rank, ep rank), in order, with
// region ids counted per parameter across the deployment, for layouts where an agent holds one
// rank, several ranks of a replica, or several replicas, with and without vLLM's EP groups;
// and with mirror_replicas, repeating agents as mirrors that unfold to the same entries.
#include <algorithm>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "common/engines/dry_run.h"
#include "common/engines/engine_layout.h"
#include "common/engines/model_config.h"

namespace {

using wb::engines::DeploymentOptions;
using wb::engines::Engine;

wb::engines::ModelConfig Load(const std::string& family) {
  auto c = wb::engines::LoadModelConfig("tests/python/engine_configs/" + family + ".json");
  REQUIRE(c.ok());
  return *c;
}

template <typename A, typename B>
bool Same(const A& a, const B& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

template <typename A, typename B>
bool SameSlices(const A& a, const B& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].start != b[i].start || a[i].size != b[i].size) return false;
  }
  return true;
}

void CheckAgainstPlainLayout(const wb::engines::ModelConfig& config, const DeploymentOptions& o) {
  auto agents = wb::engines::DeploymentLayouts(config, o);
  INFO(agents.status().ToString());
  REQUIRE(agents.ok());
  // The inference agents follow the trainers; their entries in GPU order, as the plain
  // construction appends them.
  std::vector<const wb::planner::TensorEntry*> got;
  uint64_t first_region = 0;
  for (const auto& a : *agents) {
    if (a.name.rfind("infer-", 0) != 0) {
      for (const auto& e : a.tensors) first_region = std::max(first_region, e.region);
      continue;
    }
    for (const auto& e : a.tensors) got.push_back(&e);
  }
  const int replicas = o.inference_gpus / o.tp;
  const int dp = o.engine == Engine::kVllm && o.ep > o.tp ? o.ep / o.tp : 1;
  uint64_t region = first_region + 1;
  size_t at = 0;
  for (int k = 0; k < replicas; ++k) {
    for (int r = 0; r < o.tp; ++r) {
      wb::engines::EngineOptions eo{o.engine, o.tp, r, o.ep, dp > 1 ? (k % dp) * o.tp + r : -1,
                                    o.fp8};
      auto params = wb::engines::EngineLayout(config, eo);
      REQUIRE(params.ok());
      const int gpu = k * o.tp + r;
      for (const auto& p : *params) {
        for (const auto& part : p.parts) {
          INFO("replica " << k << " rank " << r << " " << p.name << " <- " << part.source);
          REQUIRE(at < got.size());
          const wb::planner::TensorEntry& e = *got[at++];
          CHECK(e.name.str() == part.source);
          CHECK(e.view.buffer.str() == p.name);
          CHECK(Same(e.shape, part.source_shape));
          CHECK(SameSlices(e.shard, part.box));
          CHECK(Same(e.view.shape, p.shape));
          CHECK(Same(e.view.offset, part.offset));
          CHECK(e.dtype == p.dtype);
          CHECK(e.owner.role == wb::planner::Role::kInference);
          CHECK(e.owner.rank == r);
          CHECK(e.owner.replica == k);
          CHECK(e.region == region);
          CHECK(e.gpu == gpu % o.gpus_per_agent);
        }
        ++region;
      }
    }
  }
  CHECK(at == got.size());
}

}  // namespace

TEST_CASE("deployment layouts: every replica's entries as if laid out on their own") {
  struct Case {
    const char* what;
    const char* family;
    Engine engine;
    bool fp8;
    int gpus, tp, ep, gpus_per_agent;
  };
  for (const Case& c : {
           Case{"dense, tp 2, four replicas on one 8-GPU agent", "qwen3", Engine::kVllm, true, 8, 2,
                1, 8},
           Case{"dense, tp 4, a replica over two 2-GPU agents", "llama", Engine::kVllm, false, 8, 4,
                1, 2},
           Case{"MoE, vLLM EP over two replicas (ep = 2 x tp), agents of 3 GPUs", "qwen3_moe",
                Engine::kVllm, true, 8, 2, 4, 3},
           Case{"DeepSeek, SGLang EP inside the replica", "deepseek_v3", Engine::kSglang, false, 4,
                2, 2, 8},
       }) {
    INFO(c.what);
    DeploymentOptions o;
    o.trainers = 4;
    o.engine = c.engine;
    o.fp8 = c.fp8;
    o.inference_gpus = c.gpus;
    o.tp = c.tp;
    o.ep = c.ep;
    o.gpus_per_agent = c.gpus_per_agent;
    CheckAgainstPlainLayout(Load(c.family), o);
  }
}

TEST_CASE("deployment layouts: replicas laid out as mirrors unfold to the full layouts") {
  struct Case {
    const char* what;
    const char* family;
    bool fp8;
    int gpus, tp, ep, gpus_per_agent, mirrors;
  };
  for (const Case& c : {
           // A replica over two 2-GPU agents: the second replica's agents mirror the first's.
           Case{"tp 4 over 2-GPU agents", "llama", false, 16, 4, 1, 2, 6},
           // vLLM EP groups of two replicas (4 GPUs, 2 agents): the other 6 agents mirror
           // the first group's, shifted by whole groups (2, 4, 6 replicas).
           Case{"MoE, vLLM EP over two replicas", "qwen3_moe", true, 16, 2, 4, 2, 6},
           // Agents of 3 GPUs: agents 2, 3 would mirror 0, 1 (shift 3), but the partial last
           // agent holds half of a mirrored replica: every entry held instead.
           Case{"3-GPU agents, partial last agent", "qwen3", true, 16, 2, 1, 3, 0},
       }) {
    INFO(c.what);
    DeploymentOptions o;
    o.trainers = 4;
    o.fp8 = c.fp8;
    o.inference_gpus = c.gpus;
    o.tp = c.tp;
    o.ep = c.ep;
    o.gpus_per_agent = c.gpus_per_agent;
    auto full = wb::engines::DeploymentLayouts(Load(c.family), o);
    o.mirror_replicas = true;
    auto mirrored = wb::engines::DeploymentLayouts(Load(c.family), o);
    REQUIRE(full.ok());
    REQUIRE(mirrored.ok());
    CHECK(wb::planner::MirrorProblem(*mirrored).empty());
    int mirrors = 0;
    for (const auto& a : *mirrored) mirrors += a.IsMirror();
    CHECK(mirrors == c.mirrors);
    const std::vector<wb::planner::AgentLayout> unfolded = wb::planner::UnfoldMirrors(*mirrored);
    REQUIRE(unfolded.size() == full->size());
    for (size_t a = 0; a < unfolded.size(); ++a) {
      INFO("agent " << (*full)[a].name);
      CHECK(unfolded[a].name == (*full)[a].name);
      REQUIRE(unfolded[a].tensors.size() == (*full)[a].tensors.size());
      for (size_t i = 0; i < unfolded[a].tensors.size(); ++i) {
        const wb::planner::TensorEntry &u = unfolded[a].tensors[i], &f = (*full)[a].tensors[i];
        CHECK(u.name.str() == f.name.str());
        CHECK(u.view.buffer.str() == f.view.buffer.str());
        CHECK(Same(u.shape, f.shape));
        CHECK(SameSlices(u.shard, f.shard));
        CHECK(Same(u.view.offset, f.view.offset));
        CHECK(u.owner.rank == f.owner.rank);
        CHECK(u.owner.replica == f.owner.replica);
        CHECK(u.region == f.region);
        CHECK(u.gpu == f.gpu);
      }
    }
    auto a = wb::planner::BuildPlan(*full, wb::planner::PlanOptions{});
    auto b = wb::planner::BuildPlan(*mirrored, wb::planner::PlanOptions{});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->hash_hex == b->hash_hex);
  }
}

TEST_CASE("deployment layouts refuse more GPUs than kMaxDeploymentGpus") {
  DeploymentOptions o;
  o.trainers = 4;
  o.tp = 8;
  o.inference_gpus = 2000000000 - 2000000000 % 8;
  auto agents = wb::engines::DeploymentLayouts(Load("qwen3"), o);
  REQUIRE_FALSE(agents.ok());
  CHECK(agents.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(agents.status().message()).find("at most 1048576 per side") !=
        std::string::npos);
  o.inference_gpus = 8;
  o.trainers = wb::planner::kMaxDeploymentGpus + 1;
  CHECK_FALSE(wb::engines::DeploymentLayouts(Load("qwen3"), o).ok());
}

namespace {

// Megatron trainers in the dry run: every data-parallel copy holds the same entries (its own
// owner and regions), the plan covers every destination and the copies share the sending.
TEST_CASE("dry run: Megatron trainers, data-parallel copies as alternative sources") {
  const wb::engines::ModelConfig c = Load("qwen3_moe");
  DeploymentOptions o;
  o.trainer = wb::engines::TrainerDialect::kMegatron;
  o.megatron.tp = 2, o.megatron.pp = 2, o.megatron.ep = 2, o.megatron.dp = 2;
  o.inference_gpus = 4, o.tp = 2, o.gpus_per_agent = 2, o.nics_per_agent = 1;
  auto agents = wb::engines::DeploymentLayouts(c, o);
  INFO(agents.status().ToString());
  REQUIRE(agents.ok());
  // 8 trainer GPUs on 4 agents: copy d's ranks (d * pp + p) * tp + t on agents 2d, 2d + 1.
  REQUIRE(agents->size() == 6);
  CHECK((*agents)[0].tensors.size() == (*agents)[2].tensors.size());
  CHECK((*agents)[1].tensors.size() == (*agents)[3].tensors.size());
  wb::planner::PlanOptions po;
  auto plan = wb::planner::BuildPlan(*agents, po);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  const double copy0 = plan->stats.send_bytes[0] + plan->stats.send_bytes[1];
  const double copy1 = plan->stats.send_bytes[2] + plan->stats.send_bytes[3];
  INFO("copy 0 sends " << copy0 << " B, copy 1 " << copy1 << " B");
  CHECK(copy0 > 0);
  CHECK(std::max(copy0, copy1) / std::min(copy0, copy1) <= 1.05);
  o.megatron.ep = 4;  // ep x etp must divide tp x dp
  o.megatron.dp = 1;
  auto bad = wb::engines::DeploymentLayouts(c, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() ==
        "megatron: ep 4 x etp 1 must divide tp 2 x dp 1 (a stage's ranks regrouped for the "
        "experts)");
}

}  // namespace
