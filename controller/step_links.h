// Step commands (begin / execute / commit) to agents over step links (docs/performance.md,
// "Step links"): one plain TCP connection per agent carrying sealed frames (common/steplink),
// so a command costs one send and its reply one receive, with none of a gRPC stream's flow
// control, framing and thread hand-offs. A link is opened with the agent's admitted
// Agent.OpenStepLink call (id and key) and kept between steps; the calling thread drives every
// link with one epoll set, as StepStreams drives its completion queue.
//
// A command goes on a link only once the agent has one; otherwise it comes back `not_sent` and
// the caller sends it on the gRPC step stream. An agent that refuses links (step links off, an
// older build) or whose link port cannot be reached is remembered until it registers again. A
// link that breaks before the agent acknowledged it ran nothing, so its commands come back
// `not_sent` too; one that breaks later fails its commands (UNAVAILABLE), and one that does not
// answer by the deadline fails them with DEADLINE_EXCEEDED and is closed; the next command
// opens a new link.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "controller/agent_calls.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::controller {

class StepLinks {
 public:
  // `channels` must outlive this.
  explicit StepLinks(AgentChannels* channels);
  ~StepLinks();
  StepLinks(const StepLinks&) = delete;
  StepLinks& operator=(const StepLinks&) = delete;

  struct Answer {
    grpc::Status status;
    weightbeam::v1::StepReply reply;
    // The command never reached the agent (no link to it): send it another way.
    bool not_sent = false;
  };

  // Sends `commands[i]` to `endpoints[i]` (seq set here, commands moved out), opening links
  // where needed, and waits for every answer until `timeout`; answers in the same order. One
  // fan-out at a time.
  std::vector<Answer> Send(const std::vector<std::string>& endpoints,
                           std::vector<weightbeam::v1::StepCommand>* commands,
                           std::chrono::milliseconds timeout);

  // Whether commands for `endpoint` are tried on a link (false once it refused one or its link
  // port could not be reached).
  bool Links(const std::string& endpoint) const;
  // The agent at `endpoint` registered again: try a link again.
  void Reset(const std::string& endpoint);
  // Links open now (for tests and the log).
  size_t open_links() const;

 private:
  class Link;
  struct FanOut;
  // Asks each agent in `endpoints` for a link and connects, all in parallel, by `deadline`.
  void Open(const std::vector<std::string>& endpoints,
            std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);
  // Handles the epoll events that come by `deadline` (now: only those already there); false
  // when none came.
  bool Poll(std::chrono::steady_clock::time_point deadline, bool wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);
  // `link` is over: its commands get their answers (not_sent before the acknowledgement).
  // `remember`: a link that never got its acknowledgement marks the agent as one without.
  void Drop(Link* link, const std::string& why, bool remember = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);
  void NoLink(const std::string& endpoint);

  AgentChannels* const channels_;
  const int epoll_fd_;
  absl::Mutex drive_mu_;
  std::map<std::string, std::unique_ptr<Link>> links_ ABSL_GUARDED_BY(drive_mu_);  // by endpoint
  // Links dropped while their events may still be in hand; freed after each batch.
  std::vector<std::unique_ptr<Link>> dropped_ ABSL_GUARDED_BY(drive_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(drive_mu_) = 1;
  mutable absl::Mutex mu_;
  std::set<std::string> no_link_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> open_{0};
};

}  // namespace wb::controller
