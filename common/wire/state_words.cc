#include "common/wire/state_words.h"

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace wb::wire {

std::string EnumWord(const google::protobuf::EnumDescriptor* e, int value) {
  const google::protobuf::EnumValueDescriptor* v = e->FindValueByNumber(value);
  if (v == nullptr) return absl::StrCat("unknown(", value, ")");
  // Enum values are named PREFIX_WORD where PREFIX is the enum's name in upper snake case,
  // e.g. ReplicaState -> REPLICA_STATE_.
  std::string prefix;
  for (char c : e->name()) {
    if (absl::ascii_isupper(c) && !prefix.empty()) prefix += '_';
    prefix += absl::ascii_toupper(c);
  }
  prefix += '_';
  std::string name = v->name();
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return absl::AsciiStrToLower(name);
}

std::string JsonWithStateWords(const std::string& json) {
  std::vector<std::pair<std::string, std::string>> words;
  for (const auto* e :
       {weightbeam::v1::AgentActivity_descriptor(), weightbeam::v1::AgentLiveness_descriptor(),
        weightbeam::v1::ReplicaState_descriptor()}) {
    for (int i = 0; i < e->value_count(); ++i) {
      const auto* v = e->value(i);
      words.emplace_back(absl::StrCat("\"", v->name(), "\""),
                         absl::StrCat("\"", EnumWord(e, v->number()), "\""));
    }
  }
  return absl::StrReplaceAll(json, words);
}

}  // namespace wb::wire
