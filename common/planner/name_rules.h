// How tensor names match between trainers and inference engines: rename rules (regular
// expressions over source names), fusion rules (a fused destination made of named parts) and
// the FP8 scale tensor beside a weight. One home for both the planner and the storage path.
#pragma once

#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace wb::planner {

// A source tensor whose name matches `pattern` (a regular expression) is matched to the
// destination named `replacement` (with \1-style groups).
struct RenameRule {
  std::string pattern;
  std::string replacement;
};

// A destination whose name ends with `fused` is the concatenation along `dim` of the sources
// whose names replace that suffix with each of `parts`, in order.
struct FusionRule {
  std::string fused;
  std::vector<std::string> parts;
  int dim = 0;
};

// qkv_proj = q ++ k ++ v and gate_up_proj = gate ++ up, along dim 0.
std::vector<FusionRule> DefaultFusionRules();

// Rename rules compiled once; the first rule whose pattern matches the whole name wins.
class RenameRules {
 public:
  RenameRules() = default;
  // Rules whose pattern is not a valid regular expression are skipped, one line each in
  // `errors` ("rename rule <pattern>: invalid regular expression").
  static RenameRules Compile(const std::vector<RenameRule>& rules,
                             std::vector<std::string>* errors);

  bool empty() const { return rules_.empty(); }
  // The destination-side name of source `name` (unchanged when no rule matches).
  std::string Apply(const std::string& name) const;

 private:
  std::vector<std::pair<std::regex, std::string>> rules_;
};

// The names of the parts that make up destination `name` under `rule`, or nullopt when the
// name does not end with the rule's fused suffix.
std::optional<std::vector<std::string>> FusionPartNames(absl::string_view name,
                                                        const FusionRule& rule);

// The float32 block-scale tensor registered beside an FP8 weight: "<weight>_scale_inv".
std::string ScaleTensorName(absl::string_view weight);

}  // namespace wb::planner
