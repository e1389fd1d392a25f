#include "common/planner/name_rules.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace wb::planner {

std::vector<FusionRule> DefaultFusionRules() {
  return {
      {"qkv_proj.weight", {"q_proj.weight", "k_proj.weight", "v_proj.weight"}, 0},
      {"gate_up_proj.weight", {"gate_proj.weight", "up_proj.weight"}, 0},
  };
}

RenameRules RenameRules::Compile(const std::vector<RenameRule>& rules,
                                 std::vector<std::string>* errors) {
  RenameRules out;
  for (const RenameRule& r : rules) {
    try {
      // \1 in the configuration is $1 for std::regex_replace.
      std::string fmt = std::regex_replace(r.replacement, std::regex(R"(\\(\d))"), "$$$1");
      out.rules_.emplace_back(std::regex(r.pattern), std::move(fmt));
    } catch (const std::regex_error&) {
      errors->push_back(absl::StrCat("rename rule ", r.pattern, ": invalid regular expression"));
    }
  }
  return out;
}

std::string RenameRules::Apply(const std::string& name) const {
  for (const auto& [re, fmt] : rules_) {
    if (std::regex_match(name, re)) return std::regex_replace(name, re, fmt);
  }
  return name;
}

std::optional<std::vector<std::string>> FusionPartNames(absl::string_view name,
                                                        const FusionRule& rule) {
  if (!absl::EndsWith(name, rule.fused)) return std::nullopt;
  const absl::string_view prefix = name.substr(0, name.size() - rule.fused.size());
  std::vector<std::string> parts;
  parts.reserve(rule.parts.size());
  for (const std::string& p : rule.parts) parts.push_back(absl::StrCat(prefix, p));
  return parts;
}

std::string ScaleTensorName(absl::string_view weight) { return absl::StrCat(weight, "_scale_inv"); }

}  // namespace wb::planner
