#include "daemon/transport/rdma/handshake.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "weightbeam/v1/transport.pb.h"

namespace wb::transport::rdma {

std::string SerializeHandshake(const std::string& our_name, const std::vector<QpEndpoint>& ours,
                               uint32_t notice_bytes) {
  weightbeam::v1::RdmaHandshake handshake;
  handshake.set_from_agent(our_name);
  handshake.set_landing_notice_bytes(notice_bytes);
  for (const QpEndpoint& ep : ours) {
    auto* qp = handshake.add_qps();
    qp->set_device(ep.device);
    qp->set_gid(std::string(reinterpret_cast<const char*>(ep.gid.raw), 16));
    qp->set_gid_index(ep.gid_index < 0 ? 0 : ep.gid_index);
    qp->set_lid(ep.lid);
    qp->set_qpn(ep.qpn);
    qp->set_psn(ep.psn);
    qp->set_mtu(ep.mtu);
  }
  return handshake.SerializeAsString();
}

absl::StatusOr<std::vector<QpEndpoint>> ParseHandshake(const std::string& peer,
                                                       const std::string& record,
                                                       uint32_t* notice_bytes) {
  weightbeam::v1::RdmaHandshake handshake;
  if (!handshake.ParseFromString(record)) {
    return absl::InvalidArgumentError("peer '" + peer + "' sent an unreadable rdma handshake");
  }
  if (notice_bytes != nullptr) *notice_bytes = handshake.landing_notice_bytes();
  std::vector<QpEndpoint> out;
  for (const auto& qp : handshake.qps()) {
    if (qp.gid().size() != 16) {
      return absl::InvalidArgumentError(absl::StrCat("peer '", peer, "' sent a ", qp.gid().size(),
                                                     "-byte GID for ", qp.device()));
    }
    QpEndpoint ep;
    ep.device = qp.device();
    std::copy(qp.gid().begin(), qp.gid().end(), ep.gid.raw);
    ep.gid_index = static_cast<int>(qp.gid_index());
    ep.lid = qp.lid();
    ep.qpn = qp.qpn();
    ep.psn = qp.psn();
    ep.mtu = static_cast<ibv_mtu>(qp.mtu());
    out.push_back(ep);
  }
  return out;
}

absl::StatusOr<Handshaken> ConnectToPeer(VerbsEngine& engine, const std::string& our_name,
                                         const std::string& peer_name,
                                         const HandshakeExchange& exchange) {
  absl::StatusOr<VerbsEngine::NewConnection> created =
      engine.CreateConnection(peer_name, /*accepted=*/false);
  if (!created.ok()) return created.status();
  auto fail = [&](const absl::Status& s) {
    engine.DestroyConnection(created->id, "connect failed");
    return absl::Status(s.code(),
                        absl::StrCat("rdma connect to peer '", peer_name, "': ", s.message()));
  };
  const uint32_t ours = static_cast<uint32_t>(engine.options().notice_bytes);
  absl::StatusOr<std::string> theirs =
      exchange(SerializeHandshake(our_name, created->endpoints, ours));
  if (!theirs.ok()) return fail(theirs.status());
  uint32_t peer_notice_bytes = 0;
  absl::StatusOr<std::vector<QpEndpoint>> remote =
      ParseHandshake(peer_name, *theirs, &peer_notice_bytes);
  if (!remote.ok()) return fail(remote.status());
  if (absl::Status s = engine.ConnectQps(created->id, *remote, peer_notice_bytes); !s.ok()) {
    return fail(s);
  }
  Handshaken out;
  out.connection = std::move(*created);
  for (const QpEndpoint& ep : *remote) out.remote_devices.push_back(ep.device);
  return out;
}

absl::StatusOr<std::string> AcceptPeer(VerbsEngine& engine, const std::string& peer_name,
                                       const std::string& their_record) {
  uint32_t peer_notice_bytes = 0;
  absl::StatusOr<std::vector<QpEndpoint>> remote =
      ParseHandshake(peer_name, their_record, &peer_notice_bytes);
  if (!remote.ok()) return remote.status();
  // A peer that reconnects (after an error, or restarted) replaces its previous connection.
  engine.DestroyConnections(peer_name, PeerSide::kIncoming, "peer reconnected");
  absl::StatusOr<VerbsEngine::NewConnection> created =
      engine.CreateConnection(peer_name, /*accepted=*/true);
  if (!created.ok()) return created.status();
  if (absl::Status s = engine.ConnectQps(created->id, *remote, peer_notice_bytes); !s.ok()) {
    engine.DestroyConnection(created->id, "accept failed");
    return s;
  }
  return SerializeHandshake(/*our_name=*/"", created->endpoints,
                            static_cast<uint32_t>(engine.options().notice_bytes));
}

}  // namespace wb::transport::rdma
