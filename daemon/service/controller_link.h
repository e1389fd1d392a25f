// Keeps the agent known to the controller: registers (with node, endpoints, NICs, GPUs and the
// layout), heartbeats, reports layout changes, and reconnects with backoff after the controller
// restarts.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "config/credentials.h"
#include "weightbeam/v1/controller.grpc.pb.h"

namespace wb::service {

class ControllerLink {
 public:
  ControllerLink(std::string address, uint32_t heartbeat_ms,
                 std::function<weightbeam::v1::AgentInfo()> info,
                 std::function<weightbeam::v1::AgentLayout()> layout,
                 const security::ChannelFactory& channels = security::ChannelFactory());
  ~ControllerLink();

  void Start();
  void Stop();
  // Wakes the link so it reports the new layout now rather than at the next heartbeat.
  void LayoutChanged();
  bool registered() const;

 private:
  void Run();
  bool Register();
  bool Heartbeat();

  const std::string address_;
  uint32_t heartbeat_ms_;
  std::function<weightbeam::v1::AgentInfo()> info_;
  std::function<weightbeam::v1::AgentLayout()> layout_;
  std::unique_ptr<weightbeam::v1::Controller::Stub> stub_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ = 0;
  uint64_t reported_generation_ = 0;
};

}  // namespace wb::service
