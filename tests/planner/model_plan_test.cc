// Whole-model plans on a small Qwen3-0.6B-shaped layout: every destination byte (FP8 data
// and block scales included) is written exactly once; proto conversion keeps everything.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>

#include "common/planner/models.h"
#include "common/planner/plan.h"
#include "common/planner/plan_proto.h"
#include "tests/planner/layout_builder.h"

using namespace wb::planner;

namespace {

ModelSpec SmallQwen3() {
  Qwen3Config c = Qwen3_0_6B();  // hidden 1024, 16 heads, 8 KV heads, head_dim 128, inter 3072
  c.layers = 2;
  c.vocab = 4096;
  return BuildQwen3("qwen3-0.6b-small", c);
}

PlanOptions Options() {
  PlanOptions o;
  o.fusions = wb::planner::DefaultFusionRules();
  return o;
}

}  // namespace

TEST_CASE("Qwen3-0.6B-shaped plan covers every destination byte exactly once") {
  const int trainer_replicas = GENERATE(1, 2);
  const bool fp8 = GENERATE(false, true);
  TrainerOptions tr;
  tr.ranks = 4;
  tr.replicas = trainer_replicas;
  InferenceOptions inf;
  inf.gpus = 4;
  inf.tp = 2;
  inf.fp8 = fp8;
  auto agents = BuildLayouts(SmallQwen3(), tr, inf);
  REQUIRE(agents.ok());
  auto plan = BuildPlan(*agents, Options());
  INFO((plan.ok() ? "" : std::string(plan.status().message()).substr(0, 2000)));
  REQUIRE(plan.ok());

  // One byte counter per destination byte.
  std::map<std::pair<int, int>, std::vector<uint8_t>> hits;
  uint64_t dst_bytes = 0;
  for (size_t a = 0; a < agents->size(); ++a) {
    const auto& tensors = (*agents)[a].tensors;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (tensors[t].owner.role != Role::kInference) continue;
      hits[{int(a), int(t)}].assign(tensors[t].region_bytes, 0);
      dst_bytes += tensors[t].region_bytes;
    }
  }
  uint64_t out_of_bounds = 0, fp8_ops = 0;
  for (size_t a = 0; a < plan->ops.size(); ++a) {
    for (const PlannedOp& op : ExecutedOps(*plan, static_cast<int32_t>(a))) {
      std::vector<uint8_t>& h = hits[{op.dst_agent, op.dst_tensor}];
      const uint64_t row_bytes = op.row_elems * DTypeBytes(op.DstDType());
      for (uint64_t r = 0; r < op.rows; ++r) {
        const uint64_t base = op.dst_offset + r * op.dst_stride;
        if (base + row_bytes > h.size()) {
          ++out_of_bounds;
          continue;
        }
        for (uint64_t b = 0; b < row_bytes; ++b) ++h[base + b];
      }
      if (op.GetTransform() == weightbeam::v1::TRANSFORM_FP8_BLOCK) {
        ++fp8_ops;
        std::vector<uint8_t>& s = hits[{op.dst_agent, op.scale_tensor}];
        for (uint64_t i = 0; i < (op.rows + 127) / 128; ++i) {
          for (uint64_t j = 0; j < (op.row_elems + 127) / 128; ++j) {
            const uint64_t at = op.scale_offset + i * op.scale_stride + j * 4;
            if (at + 4 > s.size()) {
              ++out_of_bounds;
              continue;
            }
            for (int b = 0; b < 4; ++b) ++s[at + b];
          }
        }
      }
    }
  }
  CHECK(out_of_bounds == 0);
  CHECK((fp8_ops > 0) == fp8);
  uint64_t never = 0, twice = 0;
  for (const auto& [key, h] : hits) {
    for (uint8_t c : h) never += (c == 0), twice += (c > 1);
  }
  CHECK(never == 0);
  CHECK(twice == 0);
  CHECK(plan->stats.total_bytes == dst_bytes);
  // Two inference replicas, two agents each side at most: receivers get equal bytes.
  CHECK(plan->stats.receiver_imbalance == Approx(1.0));
}

TEST_CASE("layouts survive the proto round trip and plans convert to AgentPlans") {
  TrainerOptions tr;
  tr.ranks = 2;
  InferenceOptions inf;
  inf.gpus = 2;
  inf.tp = 2;
  auto agents = BuildLayouts(SmallQwen3(), tr, inf);
  REQUIRE(agents.ok());
  std::vector<AgentLayout> back;
  for (const AgentLayout& a : *agents) {
    weightbeam::v1::AgentInfo info;
    weightbeam::v1::AgentLayout layout;
    LayoutToProto(a, &info, &layout);
    auto parsed = LayoutFromProto(info, layout);
    REQUIRE(parsed.ok());
    REQUIRE(parsed->tensors.size() == a.tensors.size());
    // LayoutFromProto lists entries by owner (role, replica, rank), each owner's in their order.
    std::vector<TensorEntry> want = a.tensors;
    std::stable_sort(want.begin(), want.end(), [](const TensorEntry& p, const TensorEntry& q) {
      if (p.owner.role != q.owner.role) return p.owner.role < q.owner.role;
      if (p.owner.replica != q.owner.replica) return p.owner.replica < q.owner.replica;
      return p.owner.rank < q.owner.rank;
    });
    for (size_t t = 0; t < a.tensors.size(); ++t) {
      const TensorEntry &x = want[t], &y = parsed->tensors[t];
      CHECK(x.name == y.name);
      CHECK(x.shape == y.shape);
      CHECK(x.region == y.region);
      CHECK(x.gpu == y.gpu);
      CHECK(x.owner.role == y.owner.role);
    }
    back.push_back(*std::move(parsed));
  }
  auto p1 = BuildPlan(*agents, Options());
  auto p2 = BuildPlan(back, Options());
  REQUIRE(p1.ok());
  REQUIRE(p2.ok());
  CHECK(p1->hash_hex == p2->hash_hex);

  auto plans = PlanToProto(*agents, *p1, 7);
  uint64_t ops = 0;
  for (const auto& p : plans) {
    CHECK(p.plan_id() == 7);
    CHECK(p.phases() == p1->phases);
    CHECK(p.peers_size() >= 1);
    ops += p.ops_size();
    for (const auto& op : p.ops()) {
      if (op.transform() == weightbeam::v1::TRANSFORM_FP8_BLOCK) {
        CHECK(op.scale_region() != 0);
        CHECK(op.dst_tensor() + "_scale_inv" != op.src_tensor());
      }
    }
  }
  CHECK(ops == p1->stats.total_ops);
  auto summary = SummaryToProto(*agents, *p1, 7);
  CHECK(summary.plan_hash() == p1->hash_hex);
  CHECK(summary.total_ops() == ops);
  CHECK(summary.senders_size() == 1);
  CHECK(summary.receivers_size() == 1);
  CHECK(summary.senders(0).bytes() == summary.total_bytes());
}

TEST_CASE("a layout with an unknown location is refused by the converter") {
  weightbeam::v1::AgentInfo info;
  weightbeam::v1::AgentLayout layout;
  layout.set_agent("a");
  auto* t = layout.add_tensors();
  t->mutable_spec()->set_name("W");
  t->mutable_owner()->set_role(weightbeam::v1::ROLE_TRAINER);
  t->set_location("gpu0");
  auto parsed = LayoutFromProto(info, layout);
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().message() ==
        "agent a tensor W: location \"gpu0\" is neither host nor cuda:N");
}

TEST_CASE(
    "synthetic layouts refuse more GPUs than kMaxDeploymentGpus instead of running out of "
    "memory") {
  TrainerOptions tr;
  tr.ranks = 4;
  InferenceOptions inf;
  inf.tp = 2;
  inf.gpus = 2000000000;  // a 2e9-GPU inference side: 250 M agents
  auto agents = BuildLayouts(SmallQwen3(), tr, inf);
  REQUIRE_FALSE(agents.ok());
  CHECK(agents.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(agents.status().message()), Catch::Contains("at most 1048576 per side"));
  inf.gpus = 4;
  tr.ranks = wb::planner::kMaxDeploymentGpus + 1;
  CHECK_FALSE(BuildLayouts(SmallQwen3(), tr, inf).ok());
}

TEST_CASE("synthetic layouts refuse agents without GPUs or NICs instead of dividing by zero") {
  struct Bad {
    const char* what;
    int gpus, nics;
    double gbps;
    bool trainer_side;
  };
  for (const Bad& b :
       {Bad{"no GPUs", 0, 8, 50, true}, Bad{"no NICs", 8, 0, 50, true},
        Bad{"a zero NIC rate", 8, 8, 0, false}, Bad{"a negative NIC rate", 8, 8, -1, false}}) {
    INFO(b.what);
    TrainerOptions tr;
    tr.ranks = 4;
    InferenceOptions inf;
    inf.gpus = 4;
    inf.tp = 2;
    auto& side_gpus = b.trainer_side ? tr.gpus_per_agent : inf.gpus_per_agent;
    auto& side_nics = b.trainer_side ? tr.nics_per_agent : inf.nics_per_agent;
    auto& side_gbps = b.trainer_side ? tr.nic_gbps : inf.nic_gbps;
    side_gpus = b.gpus;
    side_nics = b.nics;
    side_gbps = b.gbps;
    auto agents = BuildLayouts(SmallQwen3(), tr, inf);
    REQUIRE_FALSE(agents.ok());
    CHECK(agents.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(agents.status().message()),
               Catch::Contains(b.trainer_side ? "trainer agents" : "inference agents") &&
                   Catch::Contains("at least one GPU and one NIC"));
  }
}
