#include "controller/step_streams.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

using FanOut = StepFanOut;

// One agent's stream. Its four kinds of event come back on the queue tagged with the address of
// one of its members (start_, write_, read_, finish_), so the tag names stream and event. Only
// the driving thread touches it.
class StepStreams::Stream {
 public:
  // What the queue hands back: which stream (the member's address says which event).
  struct Tag {
    Stream* stream;
  };

  Stream(const std::string& endpoint, v1::Agent::Stub* stub, grpc::CompletionQueue* cq,
         const AgentChannels& channels)
      : endpoint_(endpoint) {
    channels.Stamp(&ctx_);  // the fence admits the stream at its start
    rw_ = stub->PrepareAsyncStepStream(&ctx_, cq);
    rw_->StartCall(&start_);
    outstanding_ = 1;
  }

  const std::string& endpoint() const { return endpoint_; }
  bool ended() const { return ended_; }
  // It ended UNIMPLEMENTED before answering anything: an agent without the stream.
  bool unimplemented() const { return unimplemented_; }
  // Takes new commands: not broken, not being finished.
  bool usable() const { return !failing_ && !ended_; }
  // No event to come: it can be deleted.
  bool finished() const { return ended_ && outstanding_ == 0; }
  void Cancel() { ctx_.TryCancel(); }

  // Queues `command` for the fan-out `fan` (slot `index`); only on a usable stream.
  void Send(v1::StepCommand command, FanOut* fan, size_t index) {
    pending_[command.seq()] = {fan, index};
    out_.push_back(std::move(command));
    WriteNext();
  }

  // A fan-out is over: its late answers have nowhere to go.
  void Forget(const FanOut* fan) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      it = it->second.fan == fan ? pending_.erase(it) : std::next(it);
    }
  }

  // One event for this stream; returns false when the tag is not one of its own.
  bool Handle(void* tag, bool ok) {
    if (tag == &start_) {
      --outstanding_;
      if (!ok) return Fail();
      started_ = true;
      StartRead();
      WriteNext();
    } else if (tag == &write_) {
      --outstanding_;
      writing_ = false;
      if (!ok) return Fail();  // the stream broke: Finish says why
      out_.pop_front();
      WriteNext();
    } else if (tag == &read_) {
      --outstanding_;
      reading_ = false;
      if (!ok) return Fail();
      Deliver();
      if (failing_) return Fail();  // a write failed meanwhile: no more reads, the status now
      StartRead();
    } else if (tag == &finish_) {
      --outstanding_;
      Ended(status_);
    } else {
      return false;
    }
    return true;
  }

 private:
  struct Waiter {
    FanOut* fan = nullptr;
    size_t index = 0;
  };

  // The reply just read goes to the fan-out waiting for it, if any still is.
  void Deliver() {
    v1::StepReply reply = std::move(incoming_);
    incoming_.Clear();
    answered_ = true;
    auto it = pending_.find(reply.seq());
    if (it == pending_.end()) return;  // a late answer: nobody waits for it any more
    const Waiter w = it->second;
    pending_.erase(it);
    w.fan->FillFromReply(w.index, std::move(reply));
  }

  void StartRead() {
    reading_ = true;
    ++outstanding_;
    rw_->Read(&incoming_, &read_);
  }

  void WriteNext() {
    if (!started_ || writing_ || failing_ || out_.empty()) return;
    writing_ = true;
    ++outstanding_;
    rw_->Write(out_.front(), &write_);
  }

  // Something failed: ask for the stream's status once, when no read is in flight (a Finish next
  // to the first read would ask twice for the initial metadata, which gRPC refuses by
  // aborting). A failed write means the call is over, so the read in flight fails too. No
  // TryCancel: the status would read "cancelled" instead of why the stream ended.
  bool Fail() {
    failing_ = true;
    if (!finishing_ && !reading_) {
      finishing_ = true;
      ++outstanding_;
      rw_->Finish(&status_, &finish_);
    }
    return true;
  }

  // The stream is over: every command still waiting gets its end.
  void Ended(const grpc::Status& status) {
    ended_ = true;
    const bool unimplemented = status.error_code() == grpc::StatusCode::UNIMPLEMENTED && !answered_;
    // One that ended OK (the agent closed its side) did not answer: unavailable.
    const grpc::Status why =
        status.ok()
            ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the agent closed its step stream")
            : grpc::Status(status.error_code(),
                           absl::StrCat("step stream: ", status.error_message()));
    for (auto& [seq, w] : pending_) {
      Answer answer;
      answer.status = why;
      answer.not_sent = unimplemented;
      w.fan->Fill(w.index, std::move(answer));
    }
    pending_.clear();
    out_.clear();
    unimplemented_ = unimplemented;
  }

  const std::string endpoint_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::StepCommand, v1::StepReply>> rw_;
  Tag start_{this}, write_{this}, read_{this}, finish_{this};
  v1::StepReply incoming_;
  grpc::Status status_;
  std::deque<v1::StepCommand> out_;  // front: being written once started_
  std::map<uint64_t, Waiter> pending_;
  int outstanding_ = 0;  // operations started whose event has not come back
  bool started_ = false, writing_ = false, reading_ = false, failing_ = false, finishing_ = false;
  bool answered_ = false;
  bool ended_ = false, unimplemented_ = false;
};

StepStreams::StepStreams(AgentChannels* channels) : channels_(channels) {}

StepStreams::~StepStreams() {
  {
    absl::MutexLock lock(&drive_mu_);
    for (auto& [stream, owned] : live_) stream->Cancel();
    // Every operation of every stream comes back (cancelled), its Finish last.
    while (!live_.empty()) {
      void* tag = nullptr;
      bool ok = false;
      if (!cq_.Next(&tag, &ok)) break;
      Handle(tag, ok);
    }
  }
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
}

void StepStreams::Handle(void* tag, bool ok) {
  Stream* stream = static_cast<Stream::Tag*>(tag)->stream;
  if (!stream->Handle(tag, ok) || !stream->ended()) return;
  if (stream->unimplemented()) {
    absl::MutexLock lock(&mu_);
    unary_only_.insert(stream->endpoint());
  }
  auto open = streams_.find(stream->endpoint());
  if (open != streams_.end() && open->second == stream) streams_.erase(open);
  if (stream->finished()) live_.erase(stream);
}

void StepStreams::Drain() {
  void* tag = nullptr;
  bool ok = false;
  while (cq_.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) ==
         grpc::CompletionQueue::GOT_EVENT) {
    Handle(tag, ok);
  }
}

bool StepStreams::Streams(const std::string& endpoint) const {
  absl::MutexLock lock(&mu_);
  return !unary_only_.count(endpoint);
}

void StepStreams::Reset(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  unary_only_.erase(endpoint);
}

std::vector<StepStreams::Answer> StepStreams::Send(const std::vector<std::string>& endpoints,
                                                   std::vector<v1::StepCommand>* commands,
                                                   std::chrono::milliseconds timeout) {
  const size_t n = endpoints.size();
  FanOut fan(n);
  if (n == 0) return {};
  const auto deadline = std::chrono::system_clock::now() + timeout;
  absl::MutexLock lock(&drive_mu_);
  Drain();  // streams that ended since the last fan-out are known before they are used
  std::vector<Stream*> used(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    Stream*& open = streams_[endpoints[i]];
    if (open == nullptr || !open->usable()) {
      auto stream =
          std::make_unique<Stream>(endpoints[i], channels_->Get(endpoints[i]), &cq_, *channels_);
      open = stream.get();
      live_[open] = std::move(stream);
    }
    used[i] = open;
    v1::StepCommand& command = (*commands)[i];
    command.set_seq(next_seq_++);
    open->Send(std::move(command), &fan, i);
  }
  void* tag = nullptr;
  bool ok = false;
  while (fan.left > 0) {
    const auto got = cq_.AsyncNext(&tag, &ok, deadline);
    if (got != grpc::CompletionQueue::GOT_EVENT) break;  // the deadline passed
    Handle(tag, ok);
  }
  for (size_t i = 0; i < n; ++i) {
    if (fan.done[i]) continue;
    fan.Fill(i, {grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"), {}});
    // No answer in time: the stream may be half-open or its agent wedged. It is cancelled and
    // the next command to that agent opens a new one (this one goes once its end comes back).
    used[i]->Cancel();
    auto open = streams_.find(endpoints[i]);
    if (open != streams_.end() && open->second == used[i]) streams_.erase(open);
  }
  // The answers that come late find no fan-out.
  for (auto& [stream, owned] : live_) stream->Forget(&fan);
  return std::move(fan.answers);
}

}  // namespace wb::controller
