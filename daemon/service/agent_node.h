// One wb-agent: owns the transports, the region registry, the executor, the event bus and the
// two gRPC servers (Local on the Unix socket, Agent on TCP), and talks to the controller.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metric_registry.h"
#include "config/config.h"
#include "daemon/delta/delta_receiver.h"
#include "daemon/executor/capture_store.h"
#include "daemon/executor/executor.h"
#include "daemon/executor/landing_tracker.h"
#include "daemon/executor/staging_pool.h"
#include "daemon/local_api/event_bus.h"
#include "daemon/local_api/local_service.h"
#include "daemon/local_api/unix_listener.h"
#include "daemon/registry/region_registry.h"
#include "daemon/service/agent_metrics.h"
#include "daemon/service/leader_fence.h"
#include "daemon/service/peer_connector.h"
#include "daemon/staging/ack_book.h"
#include "daemon/staging/staged_swap.h"
#include "daemon/staging/staging_mirrors.h"
#include "daemon/staging/user_check.h"
#include "daemon/storage/storage_agent.h"
#include "daemon/transport/transport.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::service {

class AgentService;
class ControllerLink;

class AgentNode {
 public:
  explicit AgentNode(config::AgentConfig config);
  ~AgentNode();

  // Creates transports, binds the Unix socket (refusing when another agent serves it) and the
  // Agent service, and starts the controller link.
  absl::Status Start();
  // Aborts an in-flight step (reported to the controller) and stops serving.
  void Shutdown();
  void Wait();

  // --- what the Agent service calls ---
  weightbeam::v1::AgentInfo Info() const;
  weightbeam::v1::AgentLayout Layout() const;
  uint64_t LayoutGeneration() const { return registry_->generation(); }
  // Takes the plan (the service moves it out of the request): its ops are then held once, by
  // the executor. Delta mode: a receiving-half load fills `resp` with the receive region and
  // slots.
  absl::Status LoadPlan(weightbeam::v1::AgentPlan plan, weightbeam::v1::LoadPlanResponse* resp);
  // capture_only: copies what this agent's ops read into capture slot `capture_slot` and sends
  // nothing; from_capture: sends that capture (of the same version) instead of the live bytes.
  weightbeam::v1::AgentStepReport Execute(const weightbeam::v1::ExecuteRequest& req);
  // The storage path's begin and commit: watchers only (its bytes do not use a transport).
  absl::Status Begin(uint64_t version);
  absl::Status Commit(uint64_t version);
  // A step from the controller: Begin opens the transports' step fence for `step_id` (writes of
  // any other step are refused from then on); Commit requires that fence still open, with no
  // write of the step refused, and closes it. A Begin for a plan this agent was not introduced
  // to (it restarted after the plan was made) is refused, so the controller leaves it out.
  absl::Status BeginStep(uint64_t version, uint64_t step_id, uint64_t plan_id = 0);
  absl::Status CommitStep(uint64_t version, uint64_t step_id);
  // The same for a request: with `prepare` the commit is done but not announced, and a later
  // request with `announce` announces it (an Abort, or the next Begin, withdraws it instead).
  // `resp` (optional): on the commit that announces, how long the live tensors were written.
  absl::Status CommitStep(const weightbeam::v1::CommitRequest& req,
                          weightbeam::v1::CommitResponse* resp = nullptr);
  // Delta mode: applies this attempt's delta slots (and checks hashes) before committing.
  absl::Status Commit(const weightbeam::v1::CommitRequest& req,
                      weightbeam::v1::CommitResponse* resp = nullptr);
  // Whether a commit of `req` may wait (delta application, or a staged swap waiting for
  // watchers' acknowledgements): then it runs off the calling thread.
  bool CommitMayWait(const weightbeam::v1::CommitRequest& req) const;
  // Cancels the step's execution here and closes its fence if it is the open one (a late
  // abort of an older step leaves the current one alone). step_id 0: by version.
  // `receiving_only`: the agent leaves the step as a receiver only; its sending side (the
  // step's execute, its capture) goes on (AbortRequest.receiving_only).
  // `already_committed` (if given) is set when a staged swap of the version had finished:
  // nothing is aborted then, and the answer is OK (AbortResponse.already_committed).
  absl::Status Abort(uint64_t version, const std::string& reason, uint64_t step_id = 0,
                     bool receiving_only = false, bool* already_committed = nullptr);
  // A kept version live again (Agent.RestoreVersion): staged receivers with receive.keep_versions.
  absl::Status Rollback(const weightbeam::v1::RestoreVersionRequest& req,
                        weightbeam::v1::RestoreVersionResponse* resp);
  // `step_id`: also says whether that step is the one open here (step_open).
  weightbeam::v1::HealthResponse Health(uint64_t step_id = 0) const;
  absl::StatusOr<std::string> Handshake(const weightbeam::v1::HandshakeRequest& req);
  // The senders the controller's plan `plan_id` has connect to us; handshakes from others are
  // refused and senders no longer listed are disconnected (their transport tokens revoked).
  absl::Status Introduce(uint64_t plan_id, const std::vector<std::string>& senders);

  const config::AgentConfig& config() const { return config_; }
  // The leader-epoch fence every controller call and step command passes (leader_fence.h).
  LeaderFence& leader_fence() { return *fence_; }
  int agent_port() const { return agent_port_; }
  // The port /metrics is served on (0 when metrics_listen is empty).
  int metrics_port() const { return metrics_exporter_ ? metrics_exporter_->port() : 0; }

 private:
  absl::Status CreateTransports();
  absl::Status BindLocalSocket();
  // Connects to the plan's peers (except those in `skip`, dropped from the step) and hands its
  // operations `ops` (in phase order; `plan` itself holds none) to the executor.
  absl::Status ConnectAndLoad(const weightbeam::v1::AgentPlan& plan,
                              std::shared_ptr<const executor::OpList> ops,
                              const std::set<std::string>& skip = {});
  // Begin and Commit: refuse versions not newer than the committed one, then tell watchers.
  absl::Status Advance(weightbeam::v1::Event::Kind kind, uint64_t version);
  absl::Status CheckNewer(uint64_t version);
  // Execute with capture_only: touches neither the executor nor the step state, so it may run
  // while the previous step still sends from another slot.
  weightbeam::v1::AgentStepReport Capture(const weightbeam::v1::ExecuteRequest& req);
  // Commit's side of the fence: the step must still be open here with none of its writes
  // refused; then the fence closes.
  absl::Status CloseFenceForCommit(uint64_t version, uint64_t step_id);
  // The end of a commit whose work is done: announced at once, or held (prepare) until
  // Announce.
  absl::Status Conclude(const weightbeam::v1::CommitRequest& req,
                        weightbeam::v1::CommitResponse* resp);
  // The checks the version's received bytes must pass before it commits here
  // (CommitRequest.checks): a failure names the tensor and refuses the commit.
  // With VersionChecks.digest, `resp` gets the digests of what its ranks hold.
  // VersionChecks.digest: the replicas' digests an announce brought, told with commit(v).
  void KeepDigests(const weightbeam::v1::CommitRequest& req);
  // A version that failed its checks: counted, logged, and refused with wire::kCheckFailed.
  absl::Status CheckRefused(uint64_t version, absl::string_view why);
  // VersionChecks.user: the check watchers' verdict on the staged version.
  absl::Status RunUserCheck(const weightbeam::v1::CommitRequest& req);
  absl::Status CheckVersion(const weightbeam::v1::CommitRequest& req,
                            weightbeam::v1::CommitResponse* resp);
  absl::Status Announce(uint64_t version, uint64_t step_id, weightbeam::v1::CommitResponse* resp);
  // Announces a committed version: in place, commit(v) at once; staged, the swap
  // (staging::StagedSwap). `resp` gets the time the live tensors were written.
  absl::Status AnnounceCommit(uint64_t version, weightbeam::v1::CommitResponse* resp);
  // Staged: refuses plans while a destination tensor has no staging mirror (budget spent).
  absl::Status CheckStagingFits(uint64_t plan_id);
  // Refuses a plan holding relay ops and ops of the agent's own (a relay never sends).
  absl::Status CheckRelayNeverSends(const weightbeam::v1::AgentPlan& plan) const;
  // A prepared version not announced: withdrawn (abort(v) to the watchers) with `reason`.
  void WithdrawPrepared(const std::string& reason);
  void Publish(weightbeam::v1::Event::Kind kind, uint64_t version, const std::string& reason);
  absl::Status StartMetrics();
  absl::Status StartStorage();

  config::AgentConfig config_;
  metrics::Registry metrics_registry_;
  AgentMetrics metrics_{&metrics_registry_};
  std::unique_ptr<metrics::HttpExporter> metrics_exporter_;
  // What has landed here in the open step: relay ops forward from it (issue 30). Before the
  // transports: their receive threads call into it until they are gone.
  executor::LandingTracker landing_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::map<std::string, transport::Transport*> by_name_;
  std::unique_ptr<registry::RegionRegistry> registry_;
  local::EventBus events_;
  std::unique_ptr<local::LocalService> local_service_;
  std::unique_ptr<AgentService> agent_service_;
  std::unique_ptr<executor::StagingPool> staging_;
  std::unique_ptr<executor::Preparer> preparer_;
  std::unique_ptr<executor::Executor> executor_;
  std::unique_ptr<executor::CaptureStore> captures_;  // config capture.max_bytes
  std::unique_ptr<delta::DeltaReceiver> delta_receiver_;
  std::unique_ptr<PeerConnector> connector_;
  std::unique_ptr<local::UnixListener> local_listener_;  // before local_server_: stops first
  std::unique_ptr<grpc::Server> local_server_;
  std::unique_ptr<grpc::Server> agent_server_;
  // One per controller in `controller` (a comma-separated list: the leader and its standbys,
  // issue 45); each registers and heartbeats on its own.
  std::vector<std::unique_ptr<ControllerLink>> links_;
  std::unique_ptr<LeaderFence> fence_;
  std::unique_ptr<storage::StorageAgent> storage_;  // config `storage`; null when off
  int agent_port_ = 0;

  mutable absl::Mutex mu_;
  uint64_t plan_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Kept to reconnect after a failure, without its ops (the executor holds those).
  weightbeam::v1::AgentPlan plan_ ABSL_GUARDED_BY(mu_);
  bool reconnect_ ABSL_GUARDED_BY(mu_) = false;
  // Peers of the plan left unconnected by the last (re)connect: a step that needs one
  // connects again.
  std::set<std::string> unconnected_ ABSL_GUARDED_BY(mu_);
  // Destinations of the loaded plan's fallback ops (TransferOp.fallback): skipped unless a step
  // names them in ExecuteRequest.direct_agents.
  std::set<std::string> fallback_peers_ ABSL_GUARDED_BY(mu_);
  uint64_t committed_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t digests_version_ ABSL_GUARDED_BY(mu_) = 0;  // the version digests_ are of
  std::vector<weightbeam::v1::ReplicaDigest> digests_ ABSL_GUARDED_BY(mu_);
  bool delta_sending_ ABSL_GUARDED_BY(mu_) = false;  // the loaded plan sends deltas
  weightbeam::v1::AgentActivity state_ ABSL_GUARDED_BY(mu_) = weightbeam::v1::AGENT_ACTIVITY_IDLE;
  std::set<std::string> introduced_ ABSL_GUARDED_BY(mu_);  // senders allowed to handshake
  uint64_t introduced_plan_ ABSL_GUARDED_BY(mu_) = 0;      // the plan they came with
  // The step this agent's fence is open for (receiving side), if any.
  bool step_open_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t open_step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t open_version_ ABSL_GUARDED_BY(mu_) = 0;
  // A step committed with `prepare` and not yet announced (or withdrawn).
  bool prepared_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t prepared_step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t prepared_version_ ABSL_GUARDED_BY(mu_) = 0;
  // receive.mode staged (null when in place): staging mirrors and acknowledging watchers.
  std::unique_ptr<staging::StagingMirrors> mirrors_;
  staging::AckBook acks_;
  staging::AckBook check_acks_{staging::CheckBookOptions()};  // VersionChecks.user watchers
  // Staged: the swap, restore and aborts (its lock is taken before mu_, never under it).
  std::unique_ptr<staging::VersionHistory> history_;  // receive.keep_versions > 0, staged
  std::unique_ptr<staging::StagedSwap> swap_;
  bool prepared_dense_ ABSL_GUARDED_BY(mu_) = false;  // the prepared version was no delta patch
  // In place: when the open step began (its live tensors are written from then on).
  std::chrono::steady_clock::time_point begun_at_ ABSL_GUARDED_BY(mu_);
  // Serializes fence moves (Begin, Commit, Abort) so the transports see them in one order.
  absl::Mutex fence_mu_;  // taken before mu_
  std::atomic<bool> shutting_down_{false};
};

}  // namespace wb::service
