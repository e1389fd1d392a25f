// Runs a loaded plan's operations for one step through a pipeline of stages connected by FIFO
// queues (stage-in -> prepare -> write -> complete), so different operations are in different
// stages at the same time. Staging memory is capped by the StagingPool's watermark; operations
// that need no transform are written straight from the source registration (zero copy).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metric_registry.h"
#include "daemon/delta/delta_sender.h"
#include "daemon/executor/capture_store.h"
#include "daemon/executor/landing_tracker.h"
#include "daemon/executor/staging_pool.h"
#include "daemon/executor/tensor_filter.h"
#include "daemon/executor/worker_pool.h"
#include "daemon/registry/region_registry.h"
#include "daemon/transport/transport.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::executor {

// Where an FP8 op's float32 block scales start in its staging buffer: after the data,
// rounded up so the floats are aligned.
inline uint64_t Fp8ScaleOffset(uint64_t data_bytes) { return (data_bytes + 15) / 16 * 16; }

// Turns an operation's source rows into the bytes that land: transformed data, densely packed
// (rows x row bytes of the destination dtype), followed for FP8 ops by the float32 block scales.
class Preparer {
 public:
  virtual ~Preparer() = default;
  // Bytes of staging the op needs; 0 when it needs no transform (written zero-copy).
  virtual uint64_t StagingBytes(const weightbeam::v1::TransferOp& op) const = 0;
  virtual absl::Status Prepare(const weightbeam::v1::TransferOp& op, const uint8_t* src,
                               uint8_t* staging) const = 0;
};

// A remote tensor in one transport's terms: the region holding it (its buffer's, where the
// transport registers buffers), where its first byte lies there, and its length.
struct RemoteTarget {
  uint64_t region = 0;
  uint64_t base = 0;
  uint64_t length = 0;
};

// Where one destination agent's writes go: the connected peer and, per remote destination
// region id (the agent-wide id from the plan), where that tensor is in the transport's terms.
struct Route {
  std::shared_ptr<transport::Peer> peer;
  transport::Transport* transport = nullptr;
  absl::flat_hash_map<uint64_t, RemoteTarget> remote_regions;
  metrics::Counter* bytes_sent = nullptr;  // optional: counts bytes acknowledged by this peer
};

struct ExecutorOptions {
  int prepare_threads = 2;
  std::chrono::milliseconds write_timeout{30000};
  uint64_t max_write_batch = 64;  // writes posted per batch
  // Test hook (tests/security/step_fence_test.cc): the write stage of version
  // `test_hold_version` holds each operation for `test_hold` before posting it, like a stage
  // that cannot be interrupted. 0: off.
  uint64_t test_hold_version = 0;
  std::chrono::milliseconds test_hold{0};
};

// A sender's ops as they came in the plan message: held as parsed (a vector of 10^6 messages
// moved out of it would be as many fresh allocations again).
using OpList = google::protobuf::RepeatedPtrField<weightbeam::v1::TransferOp>;

// Stable: ops of one phase keep their plan order. Sorts the pointers, not the messages.
void SortByPhase(OpList* ops);

class Executor {
 public:
  Executor(registry::RegionRegistry* registry, StagingPool* staging, const Preparer* preparer,
           ExecutorOptions options);

  // Replaces the plan; `routes` maps each destination agent to its route. With `delta` (delta
  // mode), steps that ask for it stage every op, compare it with its shadow and may send it as
  // a packed delta into the receiver's slot. A step still running is cancelled and waited for
  // first: nothing of the old plan is in use once Load returns.
  void Load(std::vector<weightbeam::v1::TransferOp> ops, std::map<std::string, Route> routes,
            std::shared_ptr<delta::DeltaSender> delta = nullptr);
  // The same for ops already in phase order (SortByPhase), shared, not copied: a plan of
  // 10^6 ops is held once by the agent.
  void Load(std::shared_ptr<const OpList> ops, std::map<std::string, Route> routes,
            std::shared_ptr<delta::DeltaSender> delta = nullptr);
  // The loaded ops in phase order (null before the first Load).
  std::shared_ptr<const OpList> ops() const;
  bool loaded() const;
  // Whether the loaded plan has relay ops (this agent forwards what lands in it).
  bool has_relays() const;

  // Runs every op of the loaded plan, phase by phase (a barrier between phases), except the
  // ops to the destination agents in `skip` (dropped from this step). Fails with the first
  // error, naming the operation (source -> destination tensor, peer). Every write carries
  // `step_id` (the receivers' step fence). One step at a time: a step still running is
  // cancelled (the controller gave up on it) and waited for until nothing of it is left: its
  // batches not yet on the wire are abandoned, and none is posted after its deadline.
  // With `captured` (capture_store.h), every op it has a capture for reads its source from
  // there instead of the live tensor (staged: the capture is not registered with transports).
  weightbeam::v1::AgentStepReport Execute(uint64_t version, std::chrono::milliseconds timeout,
                                          delta::StepDelta step = {},
                                          const std::set<std::string>& skip = {},
                                          uint64_t step_id = 0,
                                          std::shared_ptr<const CapturedSources> captured = nullptr,
                                          const std::set<std::string>& feeders = {},
                                          const TensorFilter& tensors = {});
  // Relay ops (TransferOp.relay) read this agent's own destination bytes and are handed on only
  // once `landing` has seen every byte of them land in the running step; they fail at once
  // when one of `feeders` (Execute; empty: any writer) went away mid-step. Set before Load.
  void SetLandingTracker(const LandingTracker* landing) { landing_ = landing; }
  // Makes a running Execute fail promptly with `reason`.
  void Cancel(const std::string& reason) { Cancel(0, reason); }
  // The same for step `step_id` only (0: whichever runs); a step cancelled before it started
  // fails at once when it comes. A late abort of an older step leaves the current one alone.
  void Cancel(uint64_t step_id, const std::string& reason);
  // Operations whose writes are posted and not yet acknowledged (all steps together).
  int64_t ops_in_flight() const { return ops_in_flight_.load(std::memory_order_relaxed); }

 private:
  struct Job;
  struct PhaseRun;
  struct Posted;
  // One Execute: its step and cancellation, which the next step never resets.
  struct StepRun {
    explicit StepRun(uint64_t step_id) : step_id(step_id) {}
    const uint64_t step_id;
    std::set<std::string> feeders;  // the agents relay ops wait on (empty: any)
    std::atomic<bool> cancelled{false};
    std::string reason;  // why it was cancelled; guarded by the executor's mu_
  };
  using Routes = std::map<std::string, Route>;
  // Cancels the step running now, if any (`reason` is what it fails with).
  void CancelCurrent(const std::string& reason);
  // One phase through the pipeline; returns its first error.
  absl::Status RunPhase(std::shared_ptr<const OpList> plan, std::shared_ptr<const Routes> routes,
                        std::shared_ptr<StepRun> step_run,
                        const std::vector<const weightbeam::v1::TransferOp*>& ops,
                        std::chrono::steady_clock::time_point deadline,
                        const delta::StepDelta& step, delta::DeltaSender* delta,
                        const CapturedSources* captured, weightbeam::v1::AgentStepReport* report);
  // The stages. Stage-in: resolve each op's source and route, in plan order; relay ops last,
  // each as soon as its bytes have landed (ForwardWhenLanded).
  void StageIn(const std::vector<const weightbeam::v1::TransferOp*>& ops, PhaseRun* run);
  void ForwardWhenLanded(std::vector<Job> relays, PhaseRun* run);
  static constexpr std::chrono::milliseconds kRelayPoll{50};
  // Prepare (on the prepare pool): transform into staging, blocking on the watermark, or pass
  // zero-copy ops on. A job that fails is dropped, its staging lease with it.
  void PrepareStage(PhaseRun* run);
  absl::Status Prepare(Job* job, PhaseRun* run);
  // Write: post each op's writes; its staging lease travels to the completion, which shares
  // the phase.
  void WriteStage(const std::shared_ptr<PhaseRun>& run);
  void Write(Job job, const std::shared_ptr<PhaseRun>& run, bool hold);
  // Zero-copy ops (no staging, no relay) to one destination agent, written as one batch of at
  // most kGroupBytes: one completion, and for tcp one FLUSH and ACK, for several ops.
  static constexpr uint64_t kGroupBytes = uint64_t{4} << 20;
  static bool Groupable(const Job& job);
  void WriteGroup(std::vector<Job> jobs, const std::shared_ptr<PhaseRun>& run);
  // A phase of at most kInlinePhaseOps ops (a tiny step), or one whose ops all go zero-copy, is
  // prepared and posted op by op on the calling thread: handing one op to the prepare pool and
  // back cost two thread wake-ups, more than the op itself.
  static constexpr size_t kInlinePhaseOps = 2;
  void PrepareAndWriteInline(const std::shared_ptr<PhaseRun>& run);
  // The write test hook (ExecutorOptions::test_hold_version) holds this phase's writes.
  bool Holds(const PhaseRun& run) const;
  absl::Status Post(Job job, const std::shared_ptr<PhaseRun>& run);
  // One batch for `jobs` (one job, or a group of Groupable jobs to one destination agent).
  absl::Status PostJobs(std::vector<Job> jobs, const std::shared_ptr<PhaseRun>& run);
  // Complete (on a transport thread): staging goes back, bytes count, one batch fewer is out.
  void Complete(PhaseRun* run, const Posted& posted, absl::Status s);
  // The barrier that ends a phase: every posted batch completed, or the deadline passed or
  // the step was cancelled (the phase fails naming the peers still holding batches).
  void AwaitCompletions(PhaseRun* run, std::chrono::steady_clock::time_point deadline);
  // After a failed phase: the peers still holding its batches abandon them (nothing queued is
  // sent late), and their completions are waited for (bounded).
  void AbandonOutstanding(PhaseRun* run);
  // Delta mode: the op's transformed bytes into `staging`, then change detection.
  absl::Status PrepareDelta(Job* job, const delta::StepDelta& step, delta::DeltaSender* delta,
                            weightbeam::v1::AgentStepReport* report, absl::Mutex* report_mu,
                            const std::atomic<bool>* cancelled);
  absl::Status RecordDelta(Job* job, const delta::OpOutcome& out, double encode_seconds,
                           const delta::StepDelta& step, weightbeam::v1::AgentStepReport* report,
                           absl::Mutex* report_mu);
  absl::Status BuildWrites(const Job& job, std::vector<transport::WriteOp>* writes) const;
  // A captured op that would go zero-copy: its rows into staging, densely (a capture is not
  // registered with the transports).
  absl::Status StageCaptured(Job* job, const std::atomic<bool>* cancelled);

  registry::RegionRegistry* registry_;
  StagingPool* staging_;
  const Preparer* preparer_;
  const LandingTracker* landing_ = nullptr;  // relay ops wait on it (SetLandingTracker)
  ExecutorOptions options_;

  // Held by Execute from start to end and by Load: steps never overlap, and a plan is never
  // replaced under one.
  absl::Mutex run_mu_;
  mutable absl::Mutex mu_;
  // Never changed once loaded: each step holds the pointer, not a copy.
  std::shared_ptr<const OpList> ops_ ABSL_GUARDED_BY(mu_);
  // Shared with the step running (and its late completions): Load swaps in a new map.
  std::shared_ptr<const Routes> routes_ ABSL_GUARDED_BY(mu_);
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  bool has_relays_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<delta::DeltaSender> delta_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<StepRun> current_ ABSL_GUARDED_BY(mu_);  // the step running, if any
  uint64_t cancelled_step_ ABSL_GUARDED_BY(mu_) = 0;       // the last step cancelled before it ran
  uint64_t last_started_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> ops_in_flight_{0};
  WorkerPool prepare_pool_;  // the prepare stage's threads, reused across phases and steps
};

}  // namespace wb::executor
