// The local transport: writes between regions registered in the same agent process (memcpy).
// It applies the same checks as a remote backend (key, bounds, withdrawn regions) and
// connects only to itself. GPU memory (a CUDA build on a host with a device) is copied by the
// CUDA driver; without CUDA it is refused with UNIMPLEMENTED, without a device with
// FAILED_PRECONDITION.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "daemon/transport/transport.h"

namespace wb::transport::local {

class LocalEngine;  // region table + copy thread, shared with the peers

class LocalTransport : public Transport {
 public:
  LocalTransport();
  ~LocalTransport() override;

  std::string Name() const override { return "local"; }
  Capabilities caps() const override;
  std::vector<weightbeam::v1::NicInfo> Nics() const override;

  absl::StatusOr<weightbeam::v1::RegionDescriptor> Register(const MemoryRef& mem,
                                                            Access access) override;
  absl::Status Deregister(uint64_t region_id) override;
  absl::StatusOr<weightbeam::v1::RegionDescriptor> RegisterBuffer(const MemoryRef& mem,
                                                                  Access access) override;
  absl::Status OpenWindow(uint64_t region_id, uint64_t offset, uint64_t length) override;
  absl::Status CloseWindow(uint64_t region_id, uint64_t offset, uint64_t length) override;

  absl::StatusOr<std::shared_ptr<Peer>> Connect(const std::string& our_name,
                                                const std::string& peer_name,
                                                const HandshakeExchange& exchange) override;
  absl::StatusOr<std::string> Accept(const std::string& peer_name,
                                     const std::string& their_record) override;
  void ForgetPeer(const std::string& peer_name, PeerSide side = PeerSide::kBoth) override {}
  void SetArrivalCallback(ArrivalCallback cb) override;
  void SetLandingCallback(LandingCallback cb) override;
  absl::Status OpenStep(uint64_t step) override;
  absl::Status CloseStep(bool committed) override;
  uint64_t RefusedWrites(uint64_t step) const override;
  void SetFenceCallback(FenceCallback cb) override;

 private:
  absl::StatusOr<weightbeam::v1::RegionDescriptor> Add(const MemoryRef& mem, Access access,
                                                       bool windowed);
  std::shared_ptr<LocalEngine> engine_;
  std::string instance_;  // "local:<pid>:<random>": the handshake record
};

absl::StatusOr<std::unique_ptr<Transport>> MakeLocalTransport(
    const wb::config::AgentConfig& config);

}  // namespace wb::transport::local
