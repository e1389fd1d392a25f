// Step commands (begin / execute / commit) to agents over step links (docs/performance.md,
// "Step links"): one plain TCP connection per agent carrying sealed frames (common/steplink),
// so a command costs one send and its reply one receive, with none of a gRPC stream's flow
// control, framing and thread hand-offs. The calling thread drives every link with one epoll
// set, as StepStreams drives its completion queue.
//
// Links are opened off the step's path: a command for an agent without a link comes back
// `not_sent` (the caller sends it on the gRPC step stream) and the agent is handed to the
// opener thread, which asks it for a link (Agent.OpenStepLink, admitted like every controller
// call), connects and completes the handshake; the next fan-out uses the link. An agent that
// refuses links (step links off, an older build) is remembered until it registers again
// (Reset); one that did not answer, whose link port cannot be reached or whose handshake fails
// (say it met a long command on the agent's one link thread) is asked again after a backoff
// (1 s, doubled after each failure in a row, at most 30 s). A link that breaks fails its
// commands (UNAVAILABLE), one that does not answer by the deadline fails them with
// DEADLINE_EXCEEDED and is closed. Reading is bounded per link and wake-up, and stops at the
// fan-out's deadline: an agent flooding frames cannot hold the driving thread.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "controller/agent_calls.h"
#include "controller/step_answers.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::controller {

class StepLinks {
 public:
  // `channels` must outlive this.
  explicit StepLinks(AgentChannels* channels);
  // Stops the opener (waiting for a round in progress, a few seconds at most) and closes every
  // link.
  ~StepLinks();
  StepLinks(const StepLinks&) = delete;
  StepLinks& operator=(const StepLinks&) = delete;

  // `not_sent`: no link to that agent yet; the command never left.
  using Answer = StepAnswer;

  // Sends `commands[i]` to `endpoints[i]` (seq set here) on their links and waits for every
  // answer until `timeout`; answers in the same order. Agents without a link come back
  // `not_sent` at once and get one opened for later. One fan-out at a time.
  std::vector<Answer> Send(const std::vector<std::string>& endpoints,
                           std::vector<weightbeam::v1::StepCommand>* commands,
                           std::chrono::milliseconds timeout);

  // Whether `endpoint` has a link ready for the next fan-out.
  bool Has(const std::string& endpoint) const;
  // Opens links to these agents in the background, where none is open or being opened and they
  // may have one.
  void Request(const std::vector<std::string>& endpoints);
  // Whether commands for `endpoint` are tried on a link (false once it refused one).
  bool Links(const std::string& endpoint) const;
  // The agent at `endpoint` registered again: try a link again.
  void Reset(const std::string& endpoint);
  // Links open now, ready or in use.
  size_t open_links() const;

 private:
  class Link;
  // The opener thread: takes requested endpoints and makes their links.
  void OpenLoop();
  // Asks each agent for a link, connects and shakes hands, in parallel; ready links go to
  // ready_.
  void Open(const std::vector<std::string>& endpoints);
  // Moves the links the opener made into links_.
  void Install() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);
  // Handles the epoll events that come by `deadline` (`wait`: false, only those already
  // there); false when none came.
  bool Poll(std::chrono::steady_clock::time_point deadline, bool wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);
  // `link` is over: its commands fail with `status` (code) and `why`.
  void Drop(Link* link, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);
  // `refused`: the agent said no (logged as info), rather than the link failing (a warning).
  void NoLink(const std::string& endpoint, const std::string& why, bool refused);

  AgentChannels* const channels_;
  const int epoll_fd_;
  absl::Mutex drive_mu_;
  std::map<std::string, std::unique_ptr<Link>> links_ ABSL_GUARDED_BY(drive_mu_);  // by endpoint
  // Links dropped while their events may still be in hand; freed after each batch.
  std::vector<std::unique_ptr<Link>> dropped_ ABSL_GUARDED_BY(drive_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(drive_mu_) = 1;

  mutable absl::Mutex mu_;
  std::set<std::string> no_link_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> linked_ ABSL_GUARDED_BY(mu_);   // in links_ or ready_
  std::set<std::string> opening_ ABSL_GUARDED_BY(mu_);  // requested, not yet done
  std::deque<std::string> requests_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::chrono::steady_clock::time_point> retry_at_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> failures_ ABSL_GUARDED_BY(mu_);  // links not made, in a row
  std::vector<std::unique_ptr<Link>> ready_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread opener_;
};

}  // namespace wb::controller
