// Step results as a Chrome / Perfetto trace (the Trace Event Format's JSON object form), for
// `wbctl step --trace FILE` and `wbctl trace FILE`: open it in ui.perfetto.dev or
// chrome://tracing. One track for the controller (a span per step, begin to commit or abort)
// and one per agent in the step reports (a span per step with its stage-in, write and complete
// phases inside): the sending agents; receiving agents report no timings of their own.
//
// The step report carries durations, not timestamps: each agent's span starts at the step's
// start (StepResult.started_unix_ms), and its phases are laid end to end inside it (clamped to
// it). Prepare runs on several threads alongside the writes, so its summed time is an argument
// of the agent's span, not a span. Timestamps are microseconds since the Unix epoch.
#pragma once

#include <string>
#include <vector>

#include "weightbeam/v1/types.pb.h"

namespace wb::client {

std::string StepTraceJson(const std::vector<weightbeam::v1::StepResult>& steps);

}  // namespace wb::client
