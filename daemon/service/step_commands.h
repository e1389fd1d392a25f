// One step command (begin / execute / commit), run the same way whichever way it came: on the
// gRPC step stream (step_stream.h) or on a step link (step_link_server.h). Begin and a dense
// commit run on the calling thread; execute and a delta commit go to `long_calls` (they wait
// on peers or apply deltas), as their unary calls do.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "daemon/executor/worker_pool.h"
#include "daemon/service/agent_node.h"
#include "weightbeam/v1/agent.pb.h"

namespace wb::service {

// A reply carrying `seq` and the status `s` (code and message).
weightbeam::v1::StepReply StepReplyFor(uint64_t seq, const absl::Status& s);

// Runs `command`; `reply` gets its one answer, on this thread or on a `long_calls` worker.
void RunStepCommand(AgentNode* node, executor::WorkerPool* long_calls,
                    weightbeam::v1::StepCommand command,
                    std::function<void(weightbeam::v1::StepReply)> reply);

}  // namespace wb::service
