// The tcp transport: one-sided writes in software. The receiving agent checks each write's
// region key and bounds, then receives the payload straight into the registered region.
// Handshake: Accept() issues a per-peer random token; Connect() presents it on every connection.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "daemon/transport/region_table.h"
#include "daemon/transport/tcp/link_rate.h"
#include "daemon/transport/tcp/tcp_options.h"
#include "daemon/transport/tcp/tcp_peer.h"
#include "daemon/transport/tcp/tcp_receiver.h"
#include "daemon/transport/transport.h"

namespace wb::transport::tcp {

class TcpTransport : public Transport {
 public:
  // Starts listening; fails if the listen address cannot be bound.
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Create(const TcpOptions& options);
  ~TcpTransport() override;

  std::string Name() const override { return "tcp"; }
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
  void ForgetPeer(const std::string& peer_name, PeerSide side = PeerSide::kBoth) override;
  void SetArrivalCallback(ArrivalCallback cb) override;
  void SetLandingCallback(LandingCallback cb) override;
  void SetPeerEndedCallback(PeerEndedCallback cb) override;
  absl::Status OpenStep(uint64_t step) override { return receiver_->OpenStep(step); }
  absl::Status CloseStep(bool) override { return receiver_->CloseStep(); }
  uint64_t RefusedWrites(uint64_t step) const override { return receiver_->RefusedWrites(step); }
  void SetFenceCallback(FenceCallback cb) override { receiver_->SetFenceCallback(std::move(cb)); }

  // Incoming batches still waiting for their FLUSH (TcpReceiver::OpenBatches).
  size_t OpenBatches() const { return receiver_->OpenBatches(); }

  // host:port peers connect to.
  const std::string& endpoint() const { return endpoint_; }

 private:
  absl::StatusOr<weightbeam::v1::RegionDescriptor> Add(const MemoryRef& mem, Access access,
                                                       bool windowed);
  explicit TcpTransport(const TcpOptions& options);

  const TcpOptions options_;
  std::shared_ptr<RegionTable> regions_;
  std::unique_ptr<TcpReceiver> receiver_;
  std::string endpoint_;
  LinkRate rate_;

  std::mutex peers_mu_;
  // Keeps outgoing peers alive until ForgetPeer or shutdown (see TcpPeer's destructor note).
  std::map<std::string, std::shared_ptr<TcpPeer>> peers_;
};

// Factory entry: options from the agent config.
absl::StatusOr<std::unique_ptr<Transport>> MakeTcpTransport(const wb::config::AgentConfig& config);

}  // namespace wb::transport::tcp
