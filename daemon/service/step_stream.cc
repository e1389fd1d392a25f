#include "daemon/service/step_stream.h"

#include <utility>

#include "daemon/service/step_commands.h"

namespace wb::service {

namespace v1 = weightbeam::v1;

void OpenStepStreams::Add(StepStreamReactor* stream) {
  absl::MutexLock lock(&mu_);
  open_.insert(stream);
  if (closed_) stream->Close();  // opened while the agent was closing them
}

void OpenStepStreams::Remove(StepStreamReactor* stream) {
  absl::MutexLock lock(&mu_);
  open_.erase(stream);
}

void OpenStepStreams::CloseAll() {
  // Under the lock: a stream cannot finish and be deleted while it is being closed (gRPC runs
  // OnDone on its own thread, never inside Finish).
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (StepStreamReactor* s : open_) s->Close();
}

bool OpenStepStreams::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

StepStreamReactor::StepStreamReactor(AgentNode* node, executor::WorkerPool* long_calls,
                                     OpenStepStreams* open)
    : node_(node), long_calls_(long_calls), open_(open) {
  StartRead(&incoming_);
  open_->Add(this);
}

void StepStreamReactor::OnDone() {
  open_->Remove(this);
  delete this;
}

void StepStreamReactor::Close() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  FinishIfIdleLocked();
}

void StepStreamReactor::OnReadDone(bool ok) {
  if (!ok) {  // the controller closed its side, or the stream broke
    absl::MutexLock lock(&mu_);
    reads_done_ = true;
    FinishIfIdleLocked();
    return;
  }
  v1::StepCommand command = std::move(incoming_);
  incoming_.Clear();
  {
    absl::MutexLock lock(&mu_);
    // Close() may have finished the stream while this read completed (shutdown, on another
    // thread): no read, write or command after Finish.
    if (finished_) return;
    ++running_;
  }
  StartRead(&incoming_);  // the next command may arrive while this one runs
  Run(std::move(command));
}

void StepStreamReactor::Run(v1::StepCommand command) {
  const uint64_t seq = command.seq();
  bool closing;
  {
    absl::MutexLock lock(&mu_);
    closing = closing_;
  }
  if (closing) {
    Reply(StepReplyFor(seq, absl::UnavailableError("agent shutting down")));
    return;
  }
  RunStepCommand(node_, long_calls_, ExecuteOn::kPool, std::move(command),
                 [this](v1::StepReply reply) { Reply(std::move(reply)); });
}

void StepStreamReactor::Reply(v1::StepReply reply) {
  absl::MutexLock lock(&mu_);
  --running_;
  if (cancelled_ || finished_) {
    FinishIfIdleLocked();
    return;
  }
  out_.push_back(std::move(reply));
  if (!writing_) {
    writing_ = true;
    StartWrite(&out_.front());
  }
}

void StepStreamReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  out_.pop_front();
  if (!ok) {  // the stream broke: the other replies have nowhere to go either
    cancelled_ = true;
    out_.clear();
  }
  if (!out_.empty()) {
    StartWrite(&out_.front());
    return;
  }
  writing_ = false;
  FinishIfIdleLocked();
}

void StepStreamReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (!writing_) out_.clear();  // a write in flight completes (not ok) and clears the rest
  FinishIfIdleLocked();
}

void StepStreamReactor::FinishIfIdleLocked() {
  if (finished_ || running_ > 0 || writing_ || !(reads_done_ || cancelled_ || closing_)) return;
  finished_ = true;
  Finish(closing_ ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "agent shutting down")
                  : grpc::Status::OK);
}

}  // namespace wb::service
