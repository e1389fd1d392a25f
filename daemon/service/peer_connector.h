// Connects this agent's transports to peer agents the controller introduced: picks a transport
// per peer, runs the handshake over the peer's Agent.Handshake RPC, and builds the executor's
// routes (per remote destination region: that transport's own region id).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc/credentials.h"
#include "daemon/executor/executor.h"
#include "daemon/transport/transport.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::service {

class PeerConnector {
 public:
  // `transports` by name ("local", "tcp", "rdma"); preference: rdma, tcp (local for ourselves).
  PeerConnector(std::string our_name, std::map<std::string, transport::Transport*> transports,
                wb::grpcutil::ChannelFactory channels = wb::grpcutil::ChannelFactory());

  absl::StatusOr<std::map<std::string, executor::Route>> Connect(
      const std::vector<weightbeam::v1::PeerIntro>& peers);
  // The same without copying the peers (a plan's peers list 10^6 regions).
  absl::StatusOr<std::map<std::string, executor::Route>> Connect(
      const std::vector<const weightbeam::v1::PeerIntro*>& peers);

 private:
  absl::StatusOr<transport::Transport*> Choose(const weightbeam::v1::PeerIntro& peer) const;

  std::string our_name_;
  std::map<std::string, transport::Transport*> transports_;
  wb::grpcutil::ChannelFactory channels_;  // TLS and token for peers' Agent.Handshake
};

}  // namespace wb::service
