// CensusReplicas and WorldComplete walk every tensor of every layout; they look at a run of one
// owner's tensors once. These cases interleave owners so that a walk which only looked at the
// first tensor of an agent, or merged runs that are not adjacent, would miss a rank.
#include "controller/replica_census.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "controller/controller_core.h"

namespace wb::controller {
namespace {

namespace v1 = weightbeam::v1;

struct Owned {
  v1::Role role;
  int replica;
  int rank;
};

AgentRecord Agent(const std::string& name, const std::vector<Owned>& tensors, bool lost = false) {
  AgentRecord a;
  a.info.set_name(name);
  a.lost = lost;
  auto layout = std::make_shared<v1::AgentLayout>();
  int i = 0;
  for (const auto& o : tensors) {
    v1::TensorLayout* t = layout->add_tensors();
    t->mutable_spec()->set_name("t" + std::to_string(i++));
    t->mutable_owner()->set_role(o.role);
    t->mutable_owner()->set_replica(o.replica);
    t->mutable_owner()->set_rank(o.rank);
  }
  a.layout = std::move(layout);
  return a;
}

constexpr v1::Role kInf = v1::ROLE_INFERENCE;
constexpr v1::Role kTrain = v1::ROLE_TRAINER;

TEST_CASE("census: owners interleaved within one agent are all counted") {
  // Replica 0 rank 1 shows up only after a run of replica 1: a census that stopped at the first
  // owner change, or kept one owner per agent, would call replica 0 incomplete.
  const std::vector<AgentRecord> agents = {
      Agent("i0", {{kInf, 0, 0}, {kInf, 0, 0}, {kInf, 1, 0}, {kInf, 1, 0}, {kInf, 0, 1}}),
      Agent("i1", {{kInf, 1, 1}, {kInf, 1, 1}})};
  const auto census = CensusReplicas(agents, 2);
  REQUIRE(census.size() == 2);
  CHECK(census.at(0).complete);
  CHECK(census.at(0).ranks == std::set<int>{0, 1});
  CHECK(census.at(0).agents == std::set<std::string>{"i0"});
  CHECK(census.at(1).complete);
  CHECK(census.at(1).agents == std::set<std::string>{"i0", "i1"});
}

TEST_CASE("census: the same owner on two agents counts both agents; a lost one apart") {
  const std::vector<AgentRecord> agents = {Agent("a", {{kInf, 3, 0}, {kInf, 3, 0}}),
                                           Agent("b", {{kInf, 3, 0}}),
                                           Agent("c", {{kInf, 3, 1}}, /*lost=*/true)};
  const auto census = CensusReplicas(agents, 2);
  REQUIRE(census.count(3));
  CHECK(census.at(3).agents == std::set<std::string>{"a", "b"});
  CHECK(census.at(3).lost_agents == std::set<std::string>{"c"});
  CHECK_FALSE(census.at(3).complete);  // rank 1 lives only on the lost agent
}

TEST_CASE("census: a replica holding fewer tensors than its peers is still registering") {
  // Replica 1's rank 1 has registered one of its two tensors: every rank is present, but a plan
  // made now would commit it with the second tensor never written. Replica 2 is sharded over
  // one rank (a different layout): its count is compared with no one.
  const std::vector<AgentRecord> agents = {
      Agent("i0", {{kInf, 0, 0}, {kInf, 0, 0}, {kInf, 0, 1}, {kInf, 0, 1}}),
      Agent("i1", {{kInf, 1, 0}, {kInf, 1, 0}, {kInf, 1, 1}}), Agent("i2", {{kInf, 2, 0}}),
      Agent("lost", {{kInf, 1, 1}, {kInf, 1, 1}}, /*lost=*/true)};
  auto census = CensusReplicas(agents, 0);
  CHECK(census.at(0).tensors == 4);
  CHECK(census.at(1).tensors == 3);  // the lost agent's tensors are not counted
  REQUIRE(census.at(1).complete);
  MarkRegistering(&census);
  CHECK(census.at(0).complete);
  CHECK_FALSE(census.at(1).complete);
  CHECK(census.at(1).registering_of == 4);
  CHECK(census.at(2).complete);
  CHECK(DescribeIncomplete(1, census.at(1), 2) == "replica 1 (still registering: 3 of 4 tensors)");
}

TEST_CASE("world: trainer ranks after a run of inference tensors on one agent are seen") {
  const std::vector<AgentRecord> agents = {
      Agent("mixed", {{kTrain, 0, 0}, {kTrain, 0, 0}, {kInf, 0, 0}, {kTrain, 0, 1}})};
  v1::ExpectedWorld world;
  world.set_trainer_ranks(2);
  world.set_inference_replicas(1);
  world.set_inference_ranks_per_replica(1);
  std::string missing;
  CHECK(WorldComplete(agents, world, &missing));
  world.set_trainer_ranks(3);
  CHECK_FALSE(WorldComplete(agents, world, &missing));
  CHECK(missing == "trainer rank 2");
}

}  // namespace
}  // namespace wb::controller
