#include "daemon/service/step_commands.h"

#include <string>
#include <utility>

namespace wb::service {

namespace v1 = weightbeam::v1;

v1::StepReply StepReplyFor(uint64_t seq, const absl::Status& s) {
  v1::StepReply reply;
  reply.set_seq(seq);
  reply.set_code(static_cast<int32_t>(s.code()));
  if (!s.ok()) reply.set_error(std::string(s.message()));
  return reply;
}

void RunStepCommand(AgentNode* node, executor::WorkerPool* long_calls, ExecuteOn execute_on,
                    v1::StepCommand command, std::function<void(v1::StepReply)> reply) {
  const uint64_t seq = command.seq();
  // The link or stream was fenced when it opened; a leader deposed since is refused here.
  if (grpc::Status fenced = node->leader_fence().AdmitEpoch(command.leader_epoch(), "step command");
      !fenced.ok()) {
    reply(StepReplyFor(seq, absl::Status(static_cast<absl::StatusCode>(fenced.error_code()),
                                         fenced.error_message())));
    return;
  }
  switch (command.command_case()) {
    case v1::StepCommand::kBegin: {
      const auto& req = command.begin();
      reply(StepReplyFor(seq, node->BeginStep(req.version(), req.step_id(), req.plan_id())));
      return;
    }
    case v1::StepCommand::kCommit: {
      // The commit's own answer travels with the reply (how long live tensors were written).
      auto commit = [node](const v1::StepCommand& c) {
        v1::CommitResponse resp;
        const v1::CommitRequest& req = c.commit();
        const bool delta = req.step_nonce() != 0 && !req.announce();
        absl::Status s = delta ? node->Commit(req, &resp) : node->CommitStep(req, &resp);
        v1::StepReply r = StepReplyFor(c.seq(), s);
        if (s.ok()) *r.mutable_commit() = std::move(resp);
        return r;
      };
      if (!node->CommitMayWait(command.commit())) {
        reply(commit(command));
        return;
      }
      // Delta mode (applying the deltas) and staged swaps (waiting for watchers) take a while:
      // off the calling thread.
      long_calls->Submit([commit, reply = std::move(reply), command = std::move(command)] {
        reply(commit(command));
      });
      return;
    }
    case v1::StepCommand::kExecute: {
      const bool from_capture = command.execute().from_capture();
      auto execute = [node, reply = std::move(reply), command = std::move(command)] {
        v1::StepReply r = StepReplyFor(command.seq(), absl::OkStatus());
        *r.mutable_execute()->mutable_report() = node->Execute(command.execute());
        reply(std::move(r));
      };
      // A send from a capture goes to the pool: the next step's capture may come on this link
      // while it sends, and must not queue behind it.
      if (execute_on == ExecuteOn::kCaller && !from_capture) {
        execute();
      } else {
        long_calls->Submit(std::move(execute));
      }
      return;
    }
    case v1::StepCommand::COMMAND_NOT_SET:
      break;
  }
  reply(StepReplyFor(seq, absl::InvalidArgumentError("step command without a command (begin, "
                                                     "execute or commit)")));
}

}  // namespace wb::service
