// A connection to one peer over the rdma transport: the peer's destination regions (rkeys per
// device) and PostBatch, which checks bounds, plans chunks over rails and queue pairs and hands
// the resolved work requests to the transport's poller thread. A failed connection (its queue
// pairs are in the error state) is re-established through the handshake on the next batch.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/transport/rdma/handshake.h"
#include "daemon/transport/transport.h"

namespace wb::transport::rdma {

class RdmaState;

// `ops` cut into consecutive batches of at most `max_writes` writes each (one landing range per
// write: a receiver holds at most kMaxLandedRangesPerBatch per batch), in order.
std::vector<std::vector<WriteOp>> SplitBatch(std::vector<WriteOp> ops, size_t max_writes);

// A BatchDone that calls `done` once `parts` calls have come, with the first failure (or OK).
BatchDone JoinDone(size_t parts, BatchDone done);

class RdmaPeer : public Peer {
 public:
  RdmaPeer(std::shared_ptr<RdmaState> state, std::string our_name, std::string name,
           HandshakeExchange exchange, Handshaken connected);
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

  // PostBatch of at most kMaxLandedRangesPerBatch writes.
  void PostBounded(std::vector<WriteOp> ops, BatchDone done);
  // The current connection, replaced by a fresh handshake when the old one has failed.
  absl::StatusOr<Handshaken> CurrentConnection();

  const std::shared_ptr<RdmaState> state_;
  const std::string our_name_;
  const std::string name_;
  const HandshakeExchange exchange_;
  std::mutex connect_mu_;  // serialises reconnects (the exchange may block)
  std::mutex mu_;
  Handshaken connected_;  // guarded by mu_
  std::map<uint64_t, RemoteRegion> regions_;
};

}  // namespace wb::transport::rdma
