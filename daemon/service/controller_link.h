// Keeps the agent known to the controller: registers (with node, endpoints, NICs, GPUs and the
// layout), heartbeats, reports layout changes, and reconnects with backoff after the controller
// restarts (a heartbeat left unanswered is retried: only an answer that says so, or three
// unanswered in a row, registers again with the whole layout). Layout reports run on their own
// thread and channel, so a large layout in flight
// never delays a heartbeat, and are coalesced: at most one per gap (4x what the last report
// cost, at least 20 ms), each carrying the latest layout, so registering 10^6 tensors in
// batches does not re-send the whole layout after every batch.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/grpc/credentials.h"
#include "weightbeam/v1/controller.grpc.pb.h"

namespace wb::service {

class ControllerLink {
 public:
  // `generation` (optional) answers the layout's generation without building the layout.
  ControllerLink(std::string address, uint32_t heartbeat_ms,
                 std::function<weightbeam::v1::AgentInfo()> info,
                 std::function<weightbeam::v1::AgentLayout()> layout,
                 std::function<uint64_t()> generation = nullptr,
                 const wb::grpcutil::ChannelFactory& channels = wb::grpcutil::ChannelFactory(),
                 std::string incarnation = "");
  ~ControllerLink();

  // 16 random bytes: an incarnation secret. The links of one agent to several controllers
  // (a leader and its standbys) share one, so each controller sees the same process.
  static std::string RandomIncarnation();

  void Start();
  void Stop();
  // Asks for a layout report soon (coalesced with other changes).
  void LayoutChanged();
  bool registered() const;
  // Layout reports sent so far (RegisterAgent and ReportLayout), for tests and benchmarks.
  uint64_t layout_reports() const { return layout_reports_.load(); }

  // The public digest of this process's incarnation (answered on Health).
  std::string incarnation_digest() const;

 private:
  void Run();         // register / heartbeat loop
  void RunReports();  // layout report loop
  bool Register();
  // What a heartbeat found: answered (kept alive), asked to register again (the controller
  // restarted or lost us), or no answer (unreachable, or too busy to answer in time).
  enum class Beat { kAlive, kRegisterAgain, kNoAnswer };
  Beat Heartbeat();
  void ReportLayout();
  // Notes a finished layout report that started at `started`, and sets the next gap.
  void ReportDone(std::chrono::steady_clock::time_point started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string address_;
  // Random per process: proves to the controller that a later call is from this same agent.
  const std::string incarnation_;
  uint32_t heartbeat_ms_;
  std::function<weightbeam::v1::AgentInfo()> info_;
  std::function<weightbeam::v1::AgentLayout()> layout_;
  std::function<uint64_t()> generation_;
  std::unique_ptr<weightbeam::v1::Controller::Stub> stub_;
  std::unique_ptr<weightbeam::v1::Controller::Stub> report_stub_;  // a separate connection
  std::thread thread_;
  std::thread reporter_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  int missed_heartbeats_ = 0;  // in a row; only the Run thread touches it
  // A report is wanted (the layout changed, or the controller asked for it).
  bool report_due_ ABSL_GUARDED_BY(mu_) = false;
  bool report_forced_ ABSL_GUARDED_BY(mu_) = false;
  bool report_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  std::string agent_name_ ABSL_GUARDED_BY(mu_);  // from the last registration
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reported_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Coalescing: no report before last_report_ + report_gap_.
  std::chrono::steady_clock::time_point last_report_ ABSL_GUARDED_BY(mu_){};
  std::chrono::milliseconds report_gap_ ABSL_GUARDED_BY(mu_){20};
  std::atomic<uint64_t> layout_reports_{0};
};

}  // namespace wb::service
