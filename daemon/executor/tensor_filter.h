// Which ops of a step run, by their source tensor's name (ExecuteRequest.only_tensors /
// skip_tensors: partial steps and frozen tensors, issue 43). Patterns are fnmatch(3) globs
// ('*', '?', '[...]'); an empty include list keeps every name.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace wb::executor {

class TensorFilter {
 public:
  TensorFilter() = default;
  TensorFilter(std::vector<std::string> include, std::vector<std::string> exclude);

  bool empty() const { return include_.empty() && exclude_.empty(); }
  // Whether ops of tensor `name` run (each name matched once, then remembered).
  bool Keeps(const std::string& name) const;

 private:
  std::vector<std::string> include_, exclude_;
  mutable std::unordered_map<std::string, bool> seen_;
};

}  // namespace wb::executor
