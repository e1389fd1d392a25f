// Human-readable plan summaries and step results, shared by wbctl and the demo.
#pragma once

#include <string>

#include "weightbeam/v1/controller.pb.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::client {

std::string FormatPlan(const weightbeam::v1::PlanSummary& plan);
std::string FormatStep(const weightbeam::v1::StepResult& step);
// Each inference replica's state, committed version and staleness (wbctl status).
std::string FormatReplicas(const weightbeam::v1::StatusResponse& status);
// With high availability: who leads, since when, the epoch, the standbys ("" without).
std::string FormatLeadership(const weightbeam::v1::StatusResponse& status);
std::string FixedPoint(double v, int digits = 3);
// Delta mode: bytes sent vs dense bytes of recent steps, one row each.
std::string FormatDeltaHistory(
    const google::protobuf::RepeatedPtrField<weightbeam::v1::StepResult>& steps);

}  // namespace wb::client
