// The agent's end of the controller's step stream (Agent.StepStream): begin / execute / commit
// commands come in on one long-lived stream and each gets one reply, in the order they finish.
// The commands run exactly as their unary calls do: begin and a dense commit on gRPC's thread,
// execute and a delta commit on the agent service's pool (they wait on peers or apply deltas).
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <set>

#include "absl/synchronization/mutex.h"
#include "daemon/executor/worker_pool.h"
#include "daemon/service/agent_node.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::service {

class StepStreamReactor;

// The streams open now: a stream stays open between steps, so shutting down ends them itself
// (the server's Shutdown would otherwise wait its whole deadline for them).
class OpenStepStreams {
 public:
  void Add(StepStreamReactor* stream);
  void Remove(StepStreamReactor* stream);
  // Ends every open stream once its running commands replied; new streams are refused.
  void CloseAll();
  bool closed() const;

 private:
  mutable absl::Mutex mu_;
  std::set<StepStreamReactor*> open_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class StepStreamReactor final
    : public grpc::ServerBidiReactor<weightbeam::v1::StepCommand, weightbeam::v1::StepReply> {
 public:
  // Starts reading at once; deletes itself when the stream is over. All three must outlive it.
  StepStreamReactor(AgentNode* node, executor::WorkerPool* long_calls, OpenStepStreams* open);

  // No more commands: the stream ends (UNAVAILABLE) once the running ones replied.
  void Close();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Runs one command; its reply goes out through Reply, now or from the pool.
  void Run(weightbeam::v1::StepCommand command);
  void Reply(weightbeam::v1::StepReply reply);
  // Finishes the stream once the controller stopped sending (or left), every command replied
  // and nothing is being written: a command still running keeps the reactor alive.
  void FinishIfIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AgentNode* const node_;
  executor::WorkerPool* const long_calls_;
  OpenStepStreams* const open_;
  weightbeam::v1::StepCommand incoming_;  // the read in flight (one at a time)
  absl::Mutex mu_;
  std::deque<weightbeam::v1::StepReply> out_ ABSL_GUARDED_BY(mu_);  // front: being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // replies have nowhere to go
  bool closing_ ABSL_GUARDED_BY(mu_) = false;    // the agent shuts down
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // commands read and not yet replied
};

}  // namespace wb::service
