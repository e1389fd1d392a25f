#include "controller/step_streams.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;

// One fan-out's answers; shared with the streams, whose late answers (after the deadline) land
// here and are dropped.
struct StepStreams::FanOut {
  explicit FanOut(size_t n) : answers(n), done(n, false), left(n) {}

  void Fill(size_t i, Answer answer) {
    absl::MutexLock lock(&mu);
    if (closed || done[i]) return;
    answers[i] = std::move(answer);
    done[i] = true;
    --left;
  }

  absl::Mutex mu;
  std::vector<Answer> answers ABSL_GUARDED_BY(mu);
  std::vector<bool> done ABSL_GUARDED_BY(mu);
  size_t left ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;  // the caller stopped waiting
};

// One agent's stream: commands are written one at a time in the order sent, a read is always
// pending, and every reply goes to the fan-out that waits for it (by seq). Holds itself alive
// until gRPC is done with it (OnDone).
class StepStreams::Stream final : public grpc::ClientBidiReactor<v1::StepCommand, v1::StepReply> {
 public:
  Stream(StepStreams* owner, std::string endpoint)
      : owner_(owner), endpoint_(std::move(endpoint)) {}

  void Start(const std::shared_ptr<Stream>& self, v1::Agent::Stub* stub) {
    self_ = self;
    stub->async()->StepStream(&ctx_, this);
    StartRead(&incoming_);
    StartCall();
  }

  // Queues `*command` (swapped out) for writing; false (and `*command` untouched) when the
  // stream has ended.
  bool Send(v1::StepCommand* command, std::shared_ptr<FanOut> fan, size_t index) {
    absl::MutexLock lock(&mu_);
    if (done_) return false;
    pending_[command->seq()] = {std::move(fan), index};
    out_.emplace_back();
    out_.back().Swap(command);
    if (!writing_ && !broken_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
    return true;
  }

  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }

  void Cancel() { ctx_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    out_.pop_front();
    if (!ok) broken_ = true;  // the stream is going down: OnDone fails what is pending
    if (broken_ || out_.empty()) {
      writing_ = false;
      return;
    }
    StartWrite(&out_.front());
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    v1::StepReply reply = std::move(incoming_);
    incoming_.Clear();
    StartRead(&incoming_);
    Waiter waiter;
    {
      absl::MutexLock lock(&mu_);
      answered_ = true;
      auto it = pending_.find(reply.seq());
      if (it == pending_.end()) return;  // not ours (the agent is confused): nobody waits for it
      waiter = std::move(it->second);
      pending_.erase(it);
    }
    Answer answer;
    if (reply.code() != 0) {
      answer.status = grpc::Status(static_cast<grpc::StatusCode>(reply.code()), reply.error());
    }
    answer.reply = std::move(reply);
    waiter.fan->Fill(waiter.index, std::move(answer));
  }

  void OnDone(const grpc::Status& status) override {
    std::map<uint64_t, Waiter> pending;
    bool unimplemented;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      pending.swap(pending_);
      unimplemented = status.error_code() == grpc::StatusCode::UNIMPLEMENTED && !answered_;
    }
    // The commands still waiting get the stream's end; one that ended OK (the agent shut its
    // side down) did not answer, so it is unavailable.
    const grpc::Status why =
        status.ok()
            ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the agent closed its step stream")
            : grpc::Status(status.error_code(),
                           absl::StrCat("step stream: ", status.error_message()));
    for (auto& [seq, waiter] : pending) {
      Answer answer;
      answer.status = why;
      answer.unimplemented = unimplemented;
      waiter.fan->Fill(waiter.index, std::move(answer));
    }
    StepStreams* owner = owner_;
    const std::string endpoint = endpoint_;
    std::shared_ptr<Stream> self = std::move(self_);  // this goes when `self` does
    owner->Ended(this, endpoint, unimplemented);      // the owner may be gone after this
  }

 private:
  struct Waiter {
    std::shared_ptr<FanOut> fan;
    size_t index = 0;
  };

  StepStreams* const owner_;
  const std::string endpoint_;
  grpc::ClientContext ctx_;
  v1::StepReply incoming_;  // the read in flight
  std::shared_ptr<Stream> self_;
  mutable absl::Mutex mu_;
  std::deque<v1::StepCommand> out_ ABSL_GUARDED_BY(mu_);  // front: being written
  std::map<uint64_t, Waiter> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

StepStreams::~StepStreams() {
  absl::MutexLock lock(&mu_);
  for (auto& [endpoint, stream] : streams_) stream->Cancel();
  mu_.Await(absl::Condition(
      +[](int* live) { return *live == 0; }, &live_));
}

std::shared_ptr<StepStreams::Stream> StepStreams::StreamTo(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  auto& slot = streams_[endpoint];
  if (slot && !slot->done()) return slot;
  auto stream = std::make_shared<Stream>(this, endpoint);
  slot = stream;
  ++live_;
  stream->Start(stream, channels_->Get(endpoint));
  return stream;
}

void StepStreams::Ended(Stream* stream, const std::string& endpoint, bool unimplemented) {
  absl::MutexLock lock(&mu_);
  if (unimplemented) unary_only_.insert(endpoint);
  auto it = streams_.find(endpoint);
  if (it != streams_.end() && it->second.get() == stream) streams_.erase(it);
  --live_;
}

bool StepStreams::Streams(const std::string& endpoint) const {
  absl::MutexLock lock(&mu_);
  return !unary_only_.count(endpoint);
}

void StepStreams::Reset(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  unary_only_.erase(endpoint);
}

int StepStreams::open_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

std::vector<StepStreams::Answer> StepStreams::Send(const std::vector<std::string>& endpoints,
                                                   std::vector<v1::StepCommand>* commands,
                                                   std::chrono::milliseconds timeout) {
  const size_t n = endpoints.size();
  auto fan = std::make_shared<FanOut>(n);
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    seq = next_seq_;
    next_seq_ += n;
  }
  std::vector<std::shared_ptr<Stream>> used(n);
  for (size_t i = 0; i < n; ++i) {
    v1::StepCommand* command = &(*commands)[i];
    command->set_seq(seq + i);
    // A stream that ended just now refuses the command: one new stream, then give up.
    for (int attempt = 0; attempt < 2 && !used[i]; ++attempt) {
      auto stream = StreamTo(endpoints[i]);
      if (stream->Send(command, fan, i)) used[i] = std::move(stream);
    }
    if (!used[i]) {
      Answer failed;
      failed.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no step stream to the agent");
      fan->Fill(i, std::move(failed));
    }
  }
  std::vector<size_t> late;
  fan->mu.LockWhenWithDeadline(absl::Condition(
                                   +[](size_t* left) { return *left == 0; }, &fan->left),
                               deadline);
  fan->closed = true;
  for (size_t i = 0; i < n; ++i) {
    if (fan->done[i]) continue;
    fan->answers[i].status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
    late.push_back(i);
  }
  std::vector<Answer> answers = std::move(fan->answers);
  fan->mu.Unlock();
  // No answer in time: the stream may be half-open or its agent wedged; the next command to
  // that agent opens a new one.
  for (size_t i : late) {
    if (used[i]) used[i]->Cancel();
  }
  return answers;
}

}  // namespace wb::controller
