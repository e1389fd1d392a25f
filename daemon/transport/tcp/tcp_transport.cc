#include "daemon/transport/tcp/tcp_transport.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net/socket_util.h"
#include "daemon/transport/gpu_memory.h"
#include "weightbeam/v1/transport.pb.h"

namespace wb::transport::tcp {

TcpTransport::TcpTransport(const TcpOptions& options)
    : options_(options), regions_(std::make_shared<RegionTable>("tcp")) {}

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(const TcpOptions& options) {
  auto listen = net::ParseHostPort(options.listen);
  if (!listen.ok()) return listen.status();
  std::unique_ptr<TcpTransport> transport(new TcpTransport(options));
  transport->receiver_ = std::make_unique<TcpReceiver>(transport->regions_, options);
  if (auto st = transport->receiver_->Start(); !st.ok()) return st;
  std::string host = options.advertise_host;
  if (host.empty()) host = listen->host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    spdlog::warn(
        "tcp transport: listening on {} without an advertise host; peers are told "
        "127.0.0.1",
        options.listen);
    host = "127.0.0.1";
  }
  transport->endpoint_ = net::FormatHostPort(host, transport->receiver_->port());
  transport->rate_ = TcpLinkRate(options.gbps, host);
  spdlog::info("tcp transport: rail tcp0 at {} rated {:.4g} GB/s ({})", transport->endpoint_,
               transport->rate_.gbps, transport->rate_.source);
  return transport;
}

TcpTransport::~TcpTransport() {
  std::map<std::string, std::shared_ptr<TcpPeer>> peers;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers.swap(peers_);
  }
  peers.clear();
  receiver_.reset();
}

Capabilities TcpTransport::caps() const {
  Capabilities caps;
  caps.gpu_memory = SoftwareGpuMemorySupported();  // staged through pinned host buffers
  caps.windows = true;
  caps.reports_landing = true;
  caps.remote = true;
  caps.max_write_bytes = 0;  // split into max_frame_bytes frames internally
  return caps;
}

std::vector<weightbeam::v1::NicInfo> TcpTransport::Nics() const {
  weightbeam::v1::NicInfo nic;
  nic.set_name("tcp0");
  nic.set_transport("tcp");
  nic.set_endpoint(endpoint_);
  nic.set_gbps(rate_.gbps);  // configured, the link's stated speed, or nominal (link_rate.h)
  return {nic};
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> TcpTransport::Add(const MemoryRef& mem,
                                                                   Access access, bool windowed) {
  if (mem.kind == MemoryKind::kCuda) {
    if (absl::Status s = CheckGpuMemory("tcp", mem); !s.ok()) return s;
  }
  auto info = regions_->Add(mem, access, windowed);
  if (!info.ok()) return info.status();
  weightbeam::v1::RegionDescriptor desc;
  desc.set_region_id(info->id);
  desc.set_length(info->length);
  auto* key = desc.add_keys();
  key->set_transport("tcp");
  key->set_device("tcp0");
  key->set_address(0);
  key->set_key(access == Access::kDestination ? info->key : 0);
  return desc;
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> TcpTransport::Register(const MemoryRef& mem,
                                                                        Access access) {
  return Add(mem, access, /*windowed=*/false);
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> TcpTransport::RegisterBuffer(const MemoryRef& mem,
                                                                              Access access) {
  return Add(mem, access, /*windowed=*/true);
}

absl::Status TcpTransport::OpenWindow(uint64_t region_id, uint64_t offset, uint64_t length) {
  return regions_->OpenWindow(region_id, offset, length);
}

absl::Status TcpTransport::CloseWindow(uint64_t region_id, uint64_t offset, uint64_t length) {
  return regions_->CloseWindow(region_id, offset, length);
}

absl::Status TcpTransport::Deregister(uint64_t region_id) { return regions_->Remove(region_id); }

absl::StatusOr<std::shared_ptr<Peer>> TcpTransport::Connect(const std::string& our_name,
                                                            const std::string& peer_name,
                                                            const HandshakeExchange& exchange) {
  weightbeam::v1::TcpHello ours;
  ours.set_from_agent(our_name);
  ours.set_endpoint(endpoint_);
  ours.set_max_frame_bytes(options_.max_frame_bytes);
  auto reply = exchange(ours.SerializeAsString());
  if (!reply.ok()) {
    return absl::Status(reply.status().code(),
                        absl::StrCat("tcp peer '", peer_name,
                                     "': handshake exchange failed: ", reply.status().message()));
  }
  weightbeam::v1::TcpHello theirs;
  if (!theirs.ParseFromString(*reply) || theirs.token().empty() || theirs.endpoint().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp peer '", peer_name, "': handshake reply is not a TcpHello with a token"));
  }
  auto peer = TcpPeer::Connect(
      our_name, peer_name, theirs.endpoint(), theirs.token(),
      theirs.max_frame_bytes() > 0 ? theirs.max_frame_bytes() : options_.max_frame_bytes, regions_,
      options_);
  if (!peer.ok()) return peer.status();
  std::shared_ptr<TcpPeer> old;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    old = std::move(peers_[peer_name]);
    peers_[peer_name] = *peer;
  }
  return std::shared_ptr<Peer>(*peer);
}

absl::StatusOr<std::string> TcpTransport::Accept(const std::string& peer_name,
                                                 const std::string& their_record) {
  weightbeam::v1::TcpHello theirs;
  if (!theirs.ParseFromString(their_record)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp transport: handshake record from '", peer_name, "' is not a TcpHello"));
  }
  weightbeam::v1::TcpHello ours;
  ours.set_from_agent(peer_name);
  ours.set_token(receiver_->IssueToken(peer_name));
  ours.set_endpoint(endpoint_);
  ours.set_max_frame_bytes(options_.max_frame_bytes);
  return ours.SerializeAsString();
}

void TcpTransport::ForgetPeer(const std::string& peer_name, PeerSide side) {
  if (side != PeerSide::kOutgoing) receiver_->ForgetPeer(peer_name);
  if (side == PeerSide::kIncoming) return;
  std::shared_ptr<TcpPeer> peer;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (auto it = peers_.find(peer_name); it != peers_.end()) {
      peer = std::move(it->second);
      peers_.erase(it);
    }
  }
  if (peer) peer->Close(absl::StrCat("tcp peer '", peer_name, "' was forgotten"));
}

void TcpTransport::SetPeerEndedCallback(PeerEndedCallback cb) {
  receiver_->SetPeerEndedCallback(std::move(cb));
}

void TcpTransport::SetLandingCallback(LandingCallback cb) {
  receiver_->SetLandingCallback(std::move(cb));
}

void TcpTransport::SetArrivalCallback(ArrivalCallback cb) {
  receiver_->SetArrivalCallback(std::move(cb));
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTcpTransport(const wb::config::AgentConfig& config) {
  auto options = TcpOptionsFromConfig(config);
  if (!options.ok()) return options.status();
  auto transport = TcpTransport::Create(*options);
  if (!transport.ok()) return transport.status();
  return std::unique_ptr<Transport>(std::move(*transport));
}

}  // namespace wb::transport::tcp
