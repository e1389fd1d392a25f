// Replica mirrors (layout.h Mirror): an inference agent that repeats another's layout for
// other replicas is held once. Planning mirrored layouts must give exactly the plan of the
// full layouts (hash, statistics, every executed op and its proto), whatever the thread
// count; FoldMirrors must fold only agents that really repeat; malformed mirrors are refused
// with a clear error. The byte-level comparison is in fan_out_bytes_test.
#include <catch2/catch.hpp>
#include <functional>
#include <string>

#include "common/planner/models.h"
#include "common/planner/plan.h"
#include "common/planner/plan_proto.h"

using namespace wb::planner;

namespace {

PlanOptions Fused(int threads = 0) {
  PlanOptions o;
  o.fusions = DefaultFusionRules();
  o.threads = threads;
  return o;
}

// Every executed op of both plans, field by field, and the ops as sent to the agents.
void RequireSamePlan(const std::vector<AgentLayout>& full, const Plan& a,
                     const std::vector<AgentLayout>& mirrored, const Plan& b) {
  REQUIRE(a.hash_hex == b.hash_hex);
  CHECK(a.stats.total_ops == b.stats.total_ops);
  CHECK(a.stats.total_bytes == b.stats.total_bytes);
  CHECK(a.stats.recv_bytes == b.stats.recv_bytes);
  CHECK(a.stats.send_bytes == b.stats.send_bytes);
  CHECK(a.stats.receiver_device_bytes == b.stats.receiver_device_bytes);
  CHECK(a.stats.is_receiver == b.stats.is_receiver);
  CHECK(a.stats.predicted_step_seconds == b.stats.predicted_step_seconds);
  REQUIRE(a.ops.size() == b.ops.size());
  uint64_t compared = 0;
  for (size_t agent = 0; agent < a.ops.size(); ++agent) {
    const OpList x = ExecutedOps(a, static_cast<int32_t>(agent));
    const OpList y = ExecutedOps(b, static_cast<int32_t>(agent));
    REQUIRE(x.size() == y.size());
    for (size_t i = 0; i < x.size(); ++i, ++compared) {
      INFO("agent " << full[agent].name << " op " << i);
      REQUIRE(x[i].dst_agent == y[i].dst_agent);
      REQUIRE(x[i].dst_tensor == y[i].dst_tensor);
      REQUIRE(x[i].scale_tensor == y[i].scale_tensor);
      REQUIRE(x[i].src_agent == y[i].src_agent);
      REQUIRE(x[i].src_tensor == y[i].src_tensor);
      REQUIRE(x[i].src_offset == y[i].src_offset);
      REQUIRE(x[i].dst_offset == y[i].dst_offset);
      REQUIRE(x[i].dst_stride == y[i].dst_stride);
      REQUIRE(x[i].rows == y[i].rows);
      REQUIRE(x[i].row_elems == y[i].row_elems);
      REQUIRE(x[i].scale_offset == y[i].scale_offset);
      REQUIRE(x[i].rail == y[i].rail);
      REQUIRE(x[i].phase == y[i].phase);
    }
  }
  CHECK(compared > 0);
  const auto pa = PlanToProto(full, a, 7);
  const auto pb = PlanToProto(mirrored, b, 7);
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    REQUIRE(pa[i].SerializeAsString() == pb[i].SerializeAsString());
  }
}

ModelSpec SmallMoe() {
  Qwen3Config c = Qwen3_0_6B();
  c.layers = 2, c.vocab = 2048, c.hidden = 512, c.experts = 4, c.moe_intermediate = 384;
  return BuildQwen3("moe", c);
}

int Mirrors(const std::vector<AgentLayout>& agents) {
  int n = 0;
  for (const AgentLayout& a : agents) n += a.IsMirror();
  return n;
}

}  // namespace

TEST_CASE("mirror: generated mirrors plan exactly like the full layouts") {
  // (tp, ep, inference GPUs, GPUs per agent): a replica per agent, two replicas per agent, a
  // replica over two agents, EP inside the replica, BF16 and FP8.
  struct Case {
    int tp, ep, gpus, per_agent;
    bool fp8;
  };
  const Case c = GENERATE(Case{2, 1, 8, 2, true}, Case{2, 1, 8, 4, true}, Case{4, 2, 16, 2, true},
                          Case{4, 1, 12, 4, false}, Case{8, 2, 32, 8, true});
  INFO("tp " << c.tp << " ep " << c.ep << " gpus " << c.gpus << " per agent " << c.per_agent);
  TrainerOptions tr;
  tr.ranks = 8, tr.ep = 2, tr.gpus_per_agent = 4;
  InferenceOptions inf;
  inf.tp = c.tp, inf.ep = c.ep, inf.gpus = c.gpus, inf.gpus_per_agent = c.per_agent;
  inf.fp8 = c.fp8;
  auto full = BuildLayouts(SmallMoe(), tr, inf);
  inf.mirror_replicas = true;
  auto mirrored = BuildLayouts(SmallMoe(), tr, inf);
  REQUIRE(full.ok());
  REQUIRE(mirrored.ok());
  REQUIRE(full->size() == mirrored->size());
  CHECK(Mirrors(*mirrored) > 0);
  // Unfolding gives back the full layouts, entry for entry.
  const std::vector<AgentLayout> unfolded = UnfoldMirrors(*mirrored);
  for (size_t a = 0; a < full->size(); ++a) {
    REQUIRE(unfolded[a].name == (*full)[a].name);
    REQUIRE(unfolded[a].tensors.size() == (*full)[a].tensors.size());
    for (size_t t = 0; t < unfolded[a].tensors.size(); ++t) {
      const TensorEntry &x = unfolded[a].tensors[t], &y = (*full)[a].tensors[t];
      REQUIRE(x.name == y.name);
      REQUIRE(x.owner.replica == y.owner.replica);
      REQUIRE(x.owner.rank == y.owner.rank);
      REQUIRE(x.region == y.region);
      REQUIRE(FormatSlice(x.shard, x.shape) == FormatSlice(y.shard, y.shape));
    }
  }
  auto a = BuildPlan(*full, Fused(1));
  REQUIRE(a.ok());
  for (int threads : {1, 2, 5}) {
    auto b = BuildPlan(*mirrored, Fused(threads));
    REQUIRE(b.ok());
    RequireSamePlan(*full, *a, *mirrored, *b);
  }
  // Without fan-out the planner unfolds mirrors itself: the old plan, hash for hash.
  PlanOptions fine = Fused();
  fine.fan_out = false;
  auto fa = BuildPlan(*full, fine);
  auto fb = BuildPlan(*mirrored, fine);
  REQUIRE(fa.ok());
  REQUIRE(fb.ok());
  CHECK(fa->hash_hex == fb->hash_hex);
}

TEST_CASE("mirror: FoldMirrors folds repeating agents, keeps their own region ids") {
  TrainerOptions tr;
  tr.ranks = 8, tr.gpus_per_agent = 4;
  InferenceOptions inf;
  inf.tp = 2, inf.gpus = 8, inf.gpus_per_agent = 2;  // four agents, a replica each
  auto full = BuildLayouts(SmallMoe(), tr, inf);
  REQUIRE(full.ok());
  // Agent infer-0002 numbers its regions from 1000: a real agent's ids are its own.
  int32_t renumbered = -1;
  for (size_t a = 0; a < full->size(); ++a) {
    if ((*full)[a].name != "infer-0002") continue;
    renumbered = static_cast<int32_t>(a);
    for (TensorEntry& e : (*full)[a].tensors) e.region += 1000;
  }
  REQUIRE(renumbered >= 0);
  std::vector<AgentLayout> folded = *full;
  CHECK(FoldMirrors(&folded) == 3);
  CHECK(folded[renumbered].IsMirror());
  CHECK(folded[renumbered].mirror.regions.size() == (*full)[renumbered].tensors.size());
  CHECK(folded[renumbered].mirror.replica_delta == 2);
  CHECK(EntryRegion(folded, renumbered, 0) == (*full)[renumbered].tensors[0].region);
  CHECK(MirrorProblem(folded).empty());
  auto a = BuildPlan(*full, Fused());
  auto b = BuildPlan(folded, Fused());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  RequireSamePlan(*full, *a, folded, *b);
  // Folding twice changes nothing.
  CHECK(FoldMirrors(&folded) == 0);
}

TEST_CASE("mirror: FoldMirrors leaves agents that differ") {
  TrainerOptions tr;
  tr.ranks = 8, tr.gpus_per_agent = 4;
  InferenceOptions inf;
  inf.tp = 2, inf.gpus = 6, inf.gpus_per_agent = 2;  // three agents, a replica each
  auto full = BuildLayouts(SmallMoe(), tr, inf);
  REQUIRE(full.ok());
  std::vector<AgentLayout> changed = *full;
  int32_t odd = -1;
  for (size_t a = 0; a < changed.size(); ++a) {
    if (changed[a].name == "infer-0001") odd = static_cast<int32_t>(a);
  }
  REQUIRE(odd >= 0);
  // Another GPU for one entry: no longer a repeat of infer-0000 (infer-0002 still is).
  changed[odd].tensors.back().gpu += 1;
  CHECK(FoldMirrors(&changed) == 1);
  CHECK_FALSE(changed[odd].IsMirror());
  CHECK(changed[odd].tensors.size() == (*full)[odd].tensors.size());
  // Trainer agents are never folded, even when two hold the same kind of slices.
  for (const AgentLayout& a : changed) {
    if (a.name.rfind("trainer", 0) == 0) CHECK_FALSE(a.IsMirror());
  }
}

TEST_CASE("mirror: malformed mirrors are refused naming the agent") {
  TrainerOptions tr;
  tr.ranks = 8, tr.gpus_per_agent = 4;
  InferenceOptions inf;
  inf.tp = 2, inf.gpus = 6, inf.gpus_per_agent = 2, inf.mirror_replicas = true;
  auto good = BuildLayouts(SmallMoe(), tr, inf);
  REQUIRE(good.ok());
  int32_t t0 = -1, m1 = -1, m2 = -1, trainer = -1;
  for (size_t a = 0; a < good->size(); ++a) {
    const std::string& n = (*good)[a].name;
    if (n == "infer-0000") t0 = static_cast<int32_t>(a);
    if (n == "infer-0001") m1 = static_cast<int32_t>(a);
    if (n == "infer-0002") m2 = static_cast<int32_t>(a);
    if (n == "trainer-0000") trainer = static_cast<int32_t>(a);
  }
  REQUIRE((t0 >= 0 && m1 >= 0 && m2 >= 0 && trainer >= 0));
  REQUIRE((*good)[m1].IsMirror());
  REQUIRE(BuildPlan(*good, Fused()).ok());

  struct Bad {
    const char* what;
    std::function<void(std::vector<AgentLayout>*)> change;
    const char* expect;
  };
  const std::vector<Bad> bad = {
      {"a mirror of a mirror", [&](auto* v) { (*v)[m2].mirror.of = m1; }, "itself a mirror"},
      {"a mirror of a trainer", [&](auto* v) { (*v)[m1].mirror.of = trainer; },
       "only inference agents mirror"},
      {"a mirror of itself", [&](auto* v) { (*v)[m1].mirror.of = m1; }, "not another agent"},
      {"an index past the end", [&](auto* v) { (*v)[m1].mirror.of = 99; }, "not another agent"},
      {"too few region ids",
       [&](auto* v) {
         (*v)[m1].mirror.regions = {1, 2, 3};
       },
       "with 3 region ids"},
      {"a shift of 0", [&](auto* v) { (*v)[m1].mirror.replica_delta = 0; }, "shift 0"},
      {"two mirrors on one replica", [&](auto* v) { (*v)[m2].mirror.replica_delta = 1; },
       "does not repeat replica"},
      {"entries of its own", [&](auto* v) { (*v)[m1].tensors.push_back((*v)[t0].tensors[0]); },
       "tensors of its own"},
  };
  for (const Bad& b : bad) {
    INFO(b.what);
    std::vector<AgentLayout> v = *good;
    b.change(&v);
    auto plan = BuildPlan(v, Fused());
    REQUIRE_FALSE(plan.ok());
    CHECK_THAT(std::string(plan.status().message()), Catch::Contains(b.expect));
    // The same refusal without fan-out (the planner unfolds mirrors there).
    PlanOptions fine = Fused();
    fine.fan_out = false;
    auto unfolded = BuildPlan(v, fine);
    REQUIRE_FALSE(unfolded.ok());
    CHECK_THAT(std::string(unfolded.status().message()), Catch::Contains(b.expect));
  }
}

TEST_CASE("threads: a refused plan lists the same problems on any thread count") {
  TrainerOptions tr;
  tr.ranks = 2, tr.gpus_per_agent = 2;  // slices of 256+ rows
  InferenceOptions inf;
  inf.tp = 2, inf.gpus = 4, inf.gpus_per_agent = 2;
  auto agents = BuildLayouts(SmallMoe(), tr, inf);
  REQUIRE(agents.ok());
  // Generation-time problems: every gate_proj source slice of 256+ rows split after 64 rows
  // (the slices still tile, but each cuts an FP8 block of its destination).
  int split = 0;
  for (AgentLayout& a : *agents) {
    std::vector<TensorEntry> out;
    for (const TensorEntry& e : a.tensors) {
      if (e.owner.role != Role::kTrainer || e.name.str().find("gate_proj") == std::string::npos ||
          e.shard.empty() || e.shard[0].size < 256) {
        out.push_back(e);
        continue;
      }
      TensorEntry head = e, tail = e;
      const uint64_t row_bytes = e.region_bytes / static_cast<uint64_t>(e.shard[0].size);
      head.shard[0].size = 64;
      head.region_bytes = 64 * row_bytes;
      tail.shard[0].start += 64;
      tail.shard[0].size -= 64;
      tail.region_bytes -= head.region_bytes;
      tail.region = e.region + 100000;
      out.push_back(head);
      out.push_back(tail);
      ++split;
    }
    a.tensors = std::move(out);
  }
  REQUIRE(split > 0);
  // Grouping-time problems, in the first and the last layer (so in the first and the last
  // shard): two ranks' FP8 scale shards of o_proj swapped (each still tiles its replica, but
  // no longer matches its weight's blocks).
  int swapped = 0;
  for (const char* name : {"model.layers.0.self_attn.o_proj.weight_scale_inv",
                           "model.layers.1.self_attn.o_proj.weight_scale_inv"}) {
    bool done = false;
    for (AgentLayout& a : *agents) {
      TensorEntry* first = nullptr;
      for (TensorEntry& e : a.tensors) {
        if (done || e.name.str() != name) continue;
        if (first == nullptr) {
          first = &e;
        } else if (FormatSlice(first->shard, first->shape) != FormatSlice(e.shard, e.shape)) {
          std::swap(first->shard, e.shard);
          done = true;
        }
      }
    }
    swapped += done;
  }
  REQUIRE(swapped == 2);
  std::string one;
  for (int threads : {1, 2, 3, 8}) {
    INFO("threads " << threads);
    auto plan = BuildPlan(*agents, Fused(threads));
    REQUIRE_FALSE(plan.ok());
    const std::string text(plan.status().message());
    if (threads == 1) {
      one = text;
      CHECK_THAT(one, Catch::Contains("splitting the 128-row block"));
      CHECK_THAT(one, Catch::Contains("holds blocks"));
    }
    CHECK(text == one);
  }
}
