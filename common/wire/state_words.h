// The words wbctl, logs and error messages print for the state enums of the wire contracts:
// AGENT_LIVENESS_ALIVE -> "alive", REPLICA_STATE_CATCHING_UP -> "catching_up".
#pragma once

#include <google/protobuf/descriptor.h>

#include <string>

#include "weightbeam/v1/agent.pb.h"
#include "weightbeam/v1/controller.pb.h"

namespace wb::wire {

// The value's name without its enum's prefix, in lower case; "unknown(N)" for a number this
// build does not know (a newer peer).
std::string EnumWord(const google::protobuf::EnumDescriptor* e, int value);

inline std::string StateWord(weightbeam::v1::AgentActivity s) {
  return EnumWord(weightbeam::v1::AgentActivity_descriptor(), s);
}
inline std::string StateWord(weightbeam::v1::AgentLiveness s) {
  return EnumWord(weightbeam::v1::AgentLiveness_descriptor(), s);
}
inline std::string StateWord(weightbeam::v1::ReplicaState s) {
  return EnumWord(weightbeam::v1::ReplicaState_descriptor(), s);
}

// Proto JSON prints enum values by name; this puts the words in their place so that
// `wbctl --json` says "alive" as the tables do. Only whole JSON strings equal to a state
// value's name are replaced.
std::string JsonWithStateWords(const std::string& json);

}  // namespace wb::wire
