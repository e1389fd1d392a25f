#include "daemon/service/peer_connector.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/status_util.h"
#include "weightbeam/v1/agent.grpc.pb.h"

namespace wb::service {

namespace v1 = weightbeam::v1;

PeerConnector::PeerConnector(std::string our_name,
                             std::map<std::string, transport::Transport*> transports,
                             wb::grpcutil::ChannelFactory channels)
    : our_name_(std::move(our_name)),
      transports_(std::move(transports)),
      channels_(std::move(channels)) {}

absl::StatusOr<transport::Transport*> PeerConnector::Choose(const v1::PeerIntro& peer) const {
  if (peer.agent() == our_name_) {
    auto it = transports_.find("local");
    if (it != transports_.end()) return it->second;
  }
  for (const char* name : {"rdma", "tcp"}) {
    auto it = transports_.find(name);
    if (it == transports_.end()) continue;
    for (const auto& nic : peer.nics()) {
      if (nic.transport() == name) return it->second;
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no transport in common with agent ", peer.agent(), " (we have ",
                   transports_.size(), " enabled; it offers ", peer.nics_size(), " NIC(s))"));
}

absl::StatusOr<std::map<std::string, executor::Route>> PeerConnector::Connect(
    const std::vector<v1::PeerIntro>& peers) {
  std::vector<const v1::PeerIntro*> pointers;
  for (const auto& p : peers) pointers.push_back(&p);
  return Connect(pointers);
}

absl::StatusOr<std::map<std::string, executor::Route>> PeerConnector::Connect(
    const std::vector<const v1::PeerIntro*>& peers) {
  std::map<std::string, executor::Route> routes;
  for (const v1::PeerIntro* p : peers) {
    const v1::PeerIntro& peer = *p;
    auto chosen = Choose(peer);
    if (!chosen.ok()) return chosen.status();
    transport::Transport* t = *chosen;
    // Only our own connections: the peer may be sending to us at the same time.
    t->ForgetPeer(peer.agent(), transport::PeerSide::kOutgoing);
    transport::HandshakeExchange exchange;
    if (peer.agent() == our_name_) {
      exchange = [t, this](const std::string& ours) { return t->Accept(our_name_, ours); };
    } else {
      auto channel = channels_.Create(peer.control_endpoint());
      auto stub = std::shared_ptr<v1::Agent::Stub>(v1::Agent::NewStub(channel));
      // The peer's name and endpoint, not the peer: its regions may number 10^6.
      exchange = [stub, t, this, agent = peer.agent(), endpoint = peer.control_endpoint()](
                     const std::string& ours) -> absl::StatusOr<std::string> {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        v1::HandshakeRequest req;
        req.set_from_agent(our_name_);
        req.set_transport(t->Name());
        req.set_record(ours);
        v1::HandshakeResponse resp;
        grpc::Status s = stub->Handshake(&ctx, req, &resp);
        if (!s.ok()) {
          return absl::UnavailableError(absl::StrCat("handshake with agent ", agent, " at ",
                                                     endpoint, " failed: ", s.error_message()));
        }
        return resp.record();
      };
    }
    auto connected = t->Connect(our_name_, peer.agent(), exchange);
    if (!connected.ok()) {
      return absl::Status(connected.status().code(),
                          absl::StrCat("connecting to agent ", peer.agent(), " over ", t->Name(),
                                       ": ", connected.status().message()));
    }
    executor::Route route;
    route.peer = *connected;
    route.transport = t;
    route.remote_regions.reserve(peer.regions_size());
    // Tensors of a buffer registered once share its transport region: added once.
    absl::flat_hash_set<uint64_t> added;
    for (const v1::RegionDescriptor& merged : peer.regions()) {
      v1::RegionDescriptor own;
      executor::RemoteTarget target;
      target.length = merged.length();
      bool found = false;
      for (const auto& key : merged.keys()) {
        if (key.transport() != t->Name()) continue;
        own.set_region_id(key.transport_region());
        *own.add_keys() = key;
        target.region = key.transport_region();
        target.base = key.base();
        // The transport region's length: the buffer's, or the tensor's own region.
        const uint64_t region_length = key.region_length() ? key.region_length() : merged.length();
        if (target.base > region_length || target.length > region_length - target.base) {
          return absl::InvalidArgumentError(
              absl::StrCat("region ", merged.region_id(), " of agent ", peer.agent(), " over ",
                           t->Name(), ": [", target.base, ", +", target.length,
                           ") lies outside its transport region (", region_length, " bytes)"));
        }
        own.set_length(region_length);
        found = true;
      }
      if (!found) {
        return absl::FailedPreconditionError(absl::StrCat("region ", merged.region_id(),
                                                          " of agent ", peer.agent(),
                                                          " is not registered with ", t->Name()));
      }
      if (added.insert(own.region_id()).second) {
        if (auto s = route.peer->AddRemoteRegion(own); !s.ok()) return s;
      }
      route.remote_regions[merged.region_id()] = target;
    }
    spdlog::info("connected to agent {} over {} ({} destination regions)", peer.agent(), t->Name(),
                 peer.regions_size());
    routes[peer.agent()] = std::move(route);
  }
  return routes;
}

}  // namespace wb::service
