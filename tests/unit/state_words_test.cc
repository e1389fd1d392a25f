// The state enums of the wire contracts print as the words wbctl has always shown.
#include "common/wire/state_words.h"

#include <google/protobuf/util/json_util.h>

#include <catch2/catch.hpp>

namespace v1 = weightbeam::v1;
using wb::wire::StateWord;

TEST_CASE("every state value prints as its lower-case word") {
  CHECK(StateWord(v1::AGENT_ACTIVITY_IDLE) == "idle");
  CHECK(StateWord(v1::AGENT_ACTIVITY_EXECUTING) == "executing");
  CHECK(StateWord(v1::AGENT_ACTIVITY_DRAINING) == "draining");
  CHECK(StateWord(v1::AGENT_LIVENESS_ALIVE) == "alive");
  CHECK(StateWord(v1::AGENT_LIVENESS_LOST) == "lost");
  CHECK(StateWord(v1::REPLICA_STATE_SERVING) == "serving");
  CHECK(StateWord(v1::REPLICA_STATE_CATCHING_UP) == "catching_up");
  CHECK(StateWord(v1::REPLICA_STATE_LOST) == "lost");
  CHECK(StateWord(v1::REPLICA_STATE_UNSPECIFIED) == "unspecified");
}

TEST_CASE("a state number this build does not know prints as unknown(N)") {
  CHECK(StateWord(static_cast<v1::ReplicaState>(9)) == "unknown(9)");
}

TEST_CASE("JSON carries the words, and only whole strings equal to a value name change") {
  v1::StatusResponse s;
  s.add_agents()->set_state(v1::AGENT_LIVENESS_LOST);
  s.mutable_agents(0)->mutable_info()->set_name("AGENT_LIVENESS_ALIVE-node");
  s.add_replicas()->set_state(v1::REPLICA_STATE_CATCHING_UP);
  std::string json;
  REQUIRE(google::protobuf::util::MessageToJsonString(s, &json).ok());
  REQUIRE(json.find("\"REPLICA_STATE_CATCHING_UP\"") != std::string::npos);
  CHECK(wb::wire::JsonWithStateWords(json) ==
        R"({"agents":[{"info":{"name":"AGENT_LIVENESS_ALIVE-node"},"state":"lost"}],)"
        R"("replicas":[{"state":"catching_up"}]})");
}
