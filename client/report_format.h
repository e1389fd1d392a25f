// Human-readable plan summaries and step results, shared by wbctl and the demo.
#pragma once

#include <string>

#include "weightbeam/v1/types.pb.h"

namespace wb::client {

std::string FormatPlan(const weightbeam::v1::PlanSummary& plan);
std::string FormatStep(const weightbeam::v1::StepResult& step);
std::string FixedPoint(double v, int digits = 3);

}  // namespace wb::client
