// The planner's cost model: what one NIC rail moves per second and what one operation costs,
// from which it balances sources and predicts a step's duration.
#pragma once

#include <map>
#include <string>

namespace wb::planner {

struct CostModel {
  double nic_gbps = 50.0;       // GB/s per NIC rail and direction
  double op_overhead_us = 2.0;  // fixed cost per operation
  // Agent name -> the fraction of its rated link speed its steps measured (0 < f <= 1; absent:
  // 1). Set by the controller from measured steps (controller/link_learning.h), never from
  // YAML: rails are priced at rate x f, and a source with copies elsewhere is chosen by its
  // load in time (bytes / f), so work moves off a link that turned slow.
  std::map<std::string, double> agent_rate_scale;
};

}  // namespace wb::planner
