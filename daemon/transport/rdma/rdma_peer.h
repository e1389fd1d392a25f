// A connection to one peer over the rdma transport: the peer's destination regions (rkeys per
// device) and PostBatch, which checks bounds, plans chunks over rails and queue pairs and hands
// the resolved work requests to the transport's poller thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/transport/transport.h"

namespace wb::transport::rdma {

class RdmaState;

class RdmaPeer : public Peer {
 public:
  // `remote_devices[i]`: the peer's device behind our queue pair i (rail-major).
  RdmaPeer(std::shared_ptr<RdmaState> state, std::string name, uint64_t connection,
           std::vector<std::string> remote_devices);
  ~RdmaPeer() override;

  const std::string& name() const override { return name_; }
  absl::Status AddRemoteRegion(const weightbeam::v1::RegionDescriptor& region) override;
  void RemoveRemoteRegion(uint64_t region_id) override;
  void PostBatch(std::vector<WriteOp> ops, BatchDone done) override;

 private:
  struct RemoteRegion {
    uint64_t length = 0;
    std::map<std::string, std::pair<uint64_t, uint32_t>> keys;  // device -> (address, rkey)
  };

  const std::shared_ptr<RdmaState> state_;
  const std::string name_;
  const uint64_t connection_;
  const std::vector<std::string> remote_devices_;
  std::mutex mu_;
  std::map<uint64_t, RemoteRegion> regions_;
};

}  // namespace wb::transport::rdma
