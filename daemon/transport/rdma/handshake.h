// The rdma connection handshake: our queue pairs' setup records (weightbeam.v1.RdmaHandshake:
// GID, QPN, PSN, MTU per queue pair) out through the caller's exchange, the peer's back in,
// and both sides' queue pairs connected pairwise.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/transport/rdma/verbs_engine.h"
#include "daemon/transport/transport.h"

namespace wb::transport::rdma {

// `notice_bytes`: our landing-notice receive buffers' size (EngineOptions::notice_bytes).
std::string SerializeHandshake(const std::string& our_name, const std::vector<QpEndpoint>& ours,
                               uint32_t notice_bytes);
// `notice_bytes` (optional) gets the peer's landing-notice buffer size (0: send it none).
absl::StatusOr<std::vector<QpEndpoint>> ParseHandshake(const std::string& peer,
                                                       const std::string& record,
                                                       uint32_t* notice_bytes = nullptr);

struct Handshaken {
  VerbsEngine::NewConnection connection;
  std::vector<std::string> remote_devices;  // the peer's device behind each of our queue pairs
};

// Initiator side: creates queue pairs, exchanges records, connects. Errors name the peer.
absl::StatusOr<Handshaken> ConnectToPeer(VerbsEngine& engine, const std::string& our_name,
                                         const std::string& peer_name,
                                         const HandshakeExchange& exchange);

// Acceptor side: replaces any earlier connection accepted from `peer_name`; returns our record.
absl::StatusOr<std::string> AcceptPeer(VerbsEngine& engine, const std::string& peer_name,
                                       const std::string& their_record);

}  // namespace wb::transport::rdma
