// The planner's cost model: what one NIC rail moves per second and what one operation costs,
// from which it balances sources and predicts a step's duration.
#pragma once

namespace wb::planner {

struct CostModel {
  double nic_gbps = 50.0;       // GB/s per NIC rail and direction
  double op_overhead_us = 2.0;  // fixed cost per operation
};

}  // namespace wb::planner
