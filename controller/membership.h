// The agents the controller knows: their description, tensor layout and liveness. An agent that
// misses heartbeats for `heartbeat_timeout` is marked lost, and the layout counts as changed.
// Layouts are immutable and shared: a snapshot of agents holding 10^6 tensors copies pointers.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "weightbeam/v1/controller.pb.h"

namespace wb::controller {

struct AgentRecord {
  weightbeam::v1::AgentInfo info;
  // Never null once registered; replaced (not changed) when the agent reports a new layout.
  std::shared_ptr<const weightbeam::v1::AgentLayout> layout =
      std::make_shared<const weightbeam::v1::AgentLayout>();
  std::chrono::steady_clock::time_point last_seen;
  bool lost = false;
  std::string incarnation;  // secret: never copied into answers
  std::string caller_host;  // the host its RegisterAgent came from (gRPC peer, port cut off)
};

// The host part of a gRPC peer string ("ipv4:10.0.0.7:51234" -> "10.0.0.7",
// "ipv6:[::1]:5" -> "[::1]"); other forms are returned whole.
std::string PeerHost(const std::string& peer);

// Checks a layout an agent reported before the planner sees it: every tensor's dtype, shape and
// shard, and that its region length is exactly the shard's bytes (with checked arithmetic: the
// planner multiplies these numbers). Errors name the agent and the tensor.
absl::Status CheckLayout(const std::string& agent, const weightbeam::v1::AgentLayout& layout);

class Membership {
 public:
  Membership(uint64_t epoch, std::chrono::milliseconds heartbeat_timeout);

  uint64_t epoch() const { return epoch_; }
  // Refused while another live agent holds the name under a different incarnation (it must be
  // lost first: no heartbeat for heartbeat_timeout), unless the new incarnation registers from
  // the same host with the same control endpoint and `endpoint_answers_as_caller()` (called
  // without the lock) confirms that the process listening there is the one registering: that
  // is the agent restarted (its old process no longer holds the port), and it takes its place
  // at once. Any other conflicting registration (another endpoint or host) asks the holder's
  // endpoint with `holder_answer(endpoint)` (without the lock): nullopt when nothing answers
  // there (connection refused, no answer in time), else the incarnation digest it answered
  // with ("" when it gave none). The name is released at once when nothing answers or a
  // different incarnation answers; it stays refused while the holder answers as itself.
  // Every registration bumps the layout version, so the next step plans again and reloads
  // plans and introductions.
  using HolderAnswer = std::function<std::optional<std::string>(const std::string& endpoint)>;
  absl::Status Register(const weightbeam::v1::AgentInfo& info, weightbeam::v1::AgentLayout layout,
                        const std::string& incarnation, const std::string& caller_host = "",
                        const std::function<bool()>& endpoint_answers_as_caller = nullptr,
                        const HolderAnswer& holder_answer = nullptr);
  // A heartbeat from another incarnation than the registered one is answered "register again"
  // and does not keep the registered agent alive.
  weightbeam::v1::HeartbeatResponse Heartbeat(const weightbeam::v1::HeartbeatRequest& req);
  // Whether `agent` is registered under `incarnation` (ReportLayout is refused otherwise).
  bool IsIncarnation(const std::string& agent, const std::string& incarnation) const;
  // False when the agent is unknown (it must register first).
  bool ReportLayout(const weightbeam::v1::AgentLayout& layout);
  // The same without copying `layout` (a Describe answer the caller owns).
  bool ReportLayout(weightbeam::v1::AgentLayout&& layout);
  // Marks agents silent for too long as lost; returns their names (newly lost only).
  std::vector<std::string> Sweep();

  std::vector<AgentRecord> Snapshot() const;
  // Every known agent's control endpoint by name (lost ones too), without copying layouts.
  std::map<std::string, std::string> Endpoints() const;
  // How many known agents are alive and how many are lost (without copying their layouts).
  int CountAgents(bool lost) const;
  // Tensors in the layouts of alive agents.
  int64_t CountTensors() const;
  // Bumps on every change that can invalidate a plan (layout, membership, loss).
  uint64_t layout_version() const;
  // The name of the first lost agent among `names`, or "" when all are alive.
  std::string FirstLost(const std::vector<std::string>& names) const;
  // Blocks until `ready()` (checked after every change) or the timeout.
  bool WaitFor(const std::function<bool()>& ready, std::chrono::milliseconds timeout);

 private:
  const uint64_t epoch_;
  const std::chrono::milliseconds heartbeat_timeout_;
  mutable absl::Mutex mu_;
  std::map<std::string, AgentRecord> agents_ ABSL_GUARDED_BY(mu_);
  uint64_t layout_version_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace wb::controller
