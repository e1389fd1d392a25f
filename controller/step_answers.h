// What the controller's ways of sending step commands (StepLinks, StepStreams) hand back: one
// answer per command, collected in command order while a fan-out is waited for.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "weightbeam/v1/agent.pb.h"

namespace wb::controller {

struct StepAnswer {
  grpc::Status status;  // the command's own status, or why it got no answer
  weightbeam::v1::StepReply reply;
  // The command never reached the agent (no link to it yet; an older agent without the
  // stream): send it another way.
  bool not_sent = false;
};

// The answers of the fan-out being waited for.
struct StepFanOut {
  explicit StepFanOut(size_t n) : answers(n), done(n, false), left(n) {}
  // The first answer for command `i` counts; later ones are dropped.
  void Fill(size_t i, StepAnswer answer) {
    if (done[i]) return;
    answers[i] = std::move(answer);
    done[i] = true;
    --left;
  }
  // Command `i`'s answer from the agent's reply (its code and error become the status).
  void FillFromReply(size_t i, weightbeam::v1::StepReply reply) {
    StepAnswer answer;
    if (reply.code() != 0) {
      answer.status = grpc::Status(static_cast<grpc::StatusCode>(reply.code()), reply.error());
    }
    answer.reply = std::move(reply);
    Fill(i, std::move(answer));
  }

  std::vector<StepAnswer> answers;
  std::vector<bool> done;
  size_t left;
};

}  // namespace wb::controller
