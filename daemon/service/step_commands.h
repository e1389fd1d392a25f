// One step command (begin / execute / commit), run the same way whichever way it came: on the
// gRPC step stream (step_stream.h) or on a step link (step_link_server.h). Begin and a dense
// commit run on the calling thread; a delta commit goes to `long_calls` (it applies deltas), as
// does execute (it waits on peers) unless the caller asks to run it itself (ExecuteOn).
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "daemon/executor/worker_pool.h"
#include "daemon/service/agent_node.h"
#include "weightbeam/v1/agent.pb.h"

namespace wb::service {

// A reply carrying `seq` and the status `s` (code and message).
weightbeam::v1::StepReply StepReplyFor(uint64_t seq, const absl::Status& s);

// Where execute runs. kPool: on a `long_calls` worker, so that the calling thread goes back to
// its other work (a gRPC stream's reactor). kCaller: on the calling thread, which then waits
// for the transfers: one thread hand-off less per step (docs/performance.md, "Execute on the
// step link's thread"); for a step link, whose thread has nothing else to do while its agent
// sends (the controller sends one command at a time and a sender gets no other in a step).
// A send from a capture (ExecuteRequest.from_capture) always goes to the pool: the next step's
// capture may come while it sends.
enum class ExecuteOn { kPool, kCaller };

// Runs `command`; `reply` gets its one answer, on this thread or on a `long_calls` worker.
void RunStepCommand(AgentNode* node, executor::WorkerPool* long_calls, ExecuteOn execute_on,
                    weightbeam::v1::StepCommand command,
                    std::function<void(weightbeam::v1::StepReply)> reply);

}  // namespace wb::service
