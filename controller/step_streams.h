// Step commands (begin / execute / commit) to agents over one long-lived bidirectional stream
// per agent (Agent.StepStream) instead of a unary call per phase: a command is one message each
// way on an open HTTP/2 stream, with no call to set up, no metadata and no admission per call.
// Every stream reports to one completion queue, driven by the thread waiting for a fan-out (as
// CallAll does): no hand-off to gRPC's callback threads. A stream that breaks (the agent died or
// restarted) fails its commands naming the cause, and the next command opens a new one; a
// command that gets no answer by its deadline fails with DEADLINE_EXCEEDED and its stream is
// cancelled, so a half-open connection cannot wedge later steps. Agents without the stream
// (UNIMPLEMENTED) are remembered and called unary until they register again.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "controller/agent_calls.h"
#include "controller/step_answers.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::controller {

class StepStreams {
 public:
  // `channels` must outlive this.
  explicit StepStreams(AgentChannels* channels);
  // Cancels every open stream and waits until gRPC is done with each.
  ~StepStreams();
  StepStreams(const StepStreams&) = delete;
  StepStreams& operator=(const StepStreams&) = delete;

  // `not_sent`: the agent does not serve StepStream (an older wb-agent); the command never ran.
  using Answer = StepAnswer;

  // Sends `commands[i]` to `endpoints[i]` (their seq is set here, the commands are moved out),
  // all at once, and waits for every answer until `timeout`; answers in the same order. One
  // fan-out at a time: a second caller waits for the first.
  std::vector<Answer> Send(const std::vector<std::string>& endpoints,
                           std::vector<weightbeam::v1::StepCommand>* commands,
                           std::chrono::milliseconds timeout);

  // Whether commands for `endpoint` go on a stream (false once it answered UNIMPLEMENTED).
  bool Streams(const std::string& endpoint) const;
  // The agent at `endpoint` registered again (maybe a newer build): try a stream again. An open
  // stream stays (a live agent registers again after missed heartbeats, maybe mid-step); one to
  // a process that is gone has ended by itself.
  void Reset(const std::string& endpoint);

 private:
  class Stream;
  // Handles one event of the queue (a stream's start, write, read or finish).
  void Handle(void* tag, bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);
  // Handles whatever already completed, without waiting.
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  AgentChannels* const channels_;
  // Held by the thread driving cq_ (Send, the destructor): the streams are touched only there.
  absl::Mutex drive_mu_;
  grpc::CompletionQueue cq_;
  std::unordered_map<std::string, Stream*> streams_ ABSL_GUARDED_BY(drive_mu_);  // by endpoint
  // Every stream not yet done with (open, or ended with events still to come); owns them.
  std::map<Stream*, std::unique_ptr<Stream>> live_ ABSL_GUARDED_BY(drive_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(drive_mu_) = 1;
  mutable absl::Mutex mu_;
  std::set<std::string> unary_only_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wb::controller
