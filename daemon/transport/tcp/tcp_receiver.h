// The receiving half of the tcp transport: a listener thread, one thread per incoming
// connection. Only connections presenting a token issued by Accept() are served; each WRITE is
// validated against the RegionTable before its payload is received straight into place.
// Against abuse: the HELLO must arrive within the handshake timeout and every frame part
// within the write timeout however slowly its bytes trickle; connections without a valid HELLO
// are capped per source address; accept survives running out of descriptors or memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/net/socket_util.h"
#include "daemon/gpu/staging.h"
#include "daemon/transport/region_table.h"
#include "daemon/transport/step_fence.h"
#include "daemon/transport/tcp/frame.h"
#include "daemon/transport/tcp/tcp_options.h"
#include "daemon/transport/transport.h"

namespace wb::transport::tcp {

class TcpReceiver {
 public:
  TcpReceiver(std::shared_ptr<RegionTable> regions, TcpOptions options);
  ~TcpReceiver();  // stops listening, closes every connection, joins the threads

  // Binds the listener and starts accepting.
  absl::Status Start();
  uint16_t port() const { return port_; }

  // Issues a fresh random token for `peer` (replacing an older one).
  std::string IssueToken(const std::string& peer);
  // Drops the peer's token and closes its connections.
  void ForgetPeer(const std::string& peer);
  void SetArrivalCallback(ArrivalCallback cb);
  void SetLandingCallback(LandingCallback cb);
  void SetPeerEndedCallback(PeerEndedCallback cb);

  // The step fence (Transport::OpenStep): writes of other steps are NACKed untouched; writes
  // of the previous step still landing are cut (their connections shut down) and waited for.
  absl::Status OpenStep(uint64_t step);
  absl::Status CloseStep();
  uint64_t RefusedWrites(uint64_t step) const { return fence_.Refused(step); }
  void SetFenceCallback(FenceCallback cb) { fence_.SetCallback(std::move(cb)); }

  // Batches whose FLUSH has not arrived yet (every peer): the receiver's bookkeeping, bounded.
  size_t OpenBatches();
  // At most this many per peer: a sender has a handful in flight per connection; a peer that
  // never sends FLUSH (or sends fresh batch ids) loses its oldest entries, which only feed the
  // received-bytes metric.
  static constexpr size_t kMaxOpenBatchesPerPeer = 1024;

 private:
  struct Connection {
    net::UniqueFd fd;
    std::string remote;  // host:port, for logs
    std::string source;  // host only: what the unauthenticated cap counts by
    std::string peer;    // set after HELLO (under conns_mu_)
    std::thread thread;
    std::atomic<bool> finished{false};
    gpu::LazyStaging staging;  // pinned ring for GPU destinations
    // Set while a payload admitted by the fence is landing, with the step it belongs to: moving
    // the fence cuts connections landing another step's bytes. Atomics, not conns_mu_, on
    // this per-frame path: a flag set just after a cut looked is seen by the next cut (the
    // fence keeps cutting every 100 ms until the writes it admitted have drained).
    std::atomic<bool> landing{false};
    std::atomic<uint64_t> landing_step{0};
  };
  struct BatchProgress {
    uint32_t parts_seen = 0;
    uint64_t bytes = 0;
    bool rejected = false;
    uint64_t epoch = 0;  // fence_epoch_ when the batch was first seen
  };
  using BatchKey = std::pair<std::string, uint64_t>;  // (peer, batch id)

  void AcceptLoop();
  void Serve(Connection* conn);
  // Reads the HELLO frame and checks its token; on success sets conn->peer and sends ACK.
  absl::Status Handshake(Connection* conn);
  // Handles one frame; an error closes the connection.
  absl::Status HandleWrite(Connection* conn, const FrameHeader& header);
  absl::Status HandleFlush(Connection* conn, const FrameHeader& header);
  absl::Status ReadHeader(Connection* conn, FrameHeader* header, bool* closed);
  absl::Status SendControl(Connection* conn, FrameType type, uint64_t batch_id,
                           const std::string& payload);
  absl::Status DiscardPayload(Connection* conn, uint64_t length);
  void ReapFinished();  // requires conns_mu_
  // Closes the oldest connection from `source` still without a valid HELLO when `source`
  // already has the maximum of those. Requires conns_mu_.
  void CapUnauthenticated(const std::string& source);
  // Shuts down the connections landing a write of a step other than `keep` (any, when
  // `keep_any` is false).
  void CutLanding(bool keep_any, uint64_t keep);
  // The batch's bookkeeping, made when first seen; the peer's oldest entry goes when it has
  // kMaxOpenBatchesPerPeer already. Requires peers_mu_.
  BatchProgress& BatchLocked(const BatchKey& key);
  void EraseBatchLocked(std::map<BatchKey, BatchProgress>::iterator it);
  // Drops the batches first seen before the fence last moved: their FLUSH will never come (a
  // step cut or aborted) or no longer matters. Takes peers_mu_.
  void DropFencedBatches();
  // One of `peer`'s authenticated connections ended: when it was the last, its batches go
  // (their FLUSH can no longer come). Takes peers_mu_.
  void ConnectionEnded(const std::string& peer);

  const std::shared_ptr<RegionTable> regions_;
  const TcpOptions options_;
  net::UniqueFd listen_fd_;
  uint16_t port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  StepFence fence_{"tcp"};

  std::mutex conns_mu_;
  std::list<std::unique_ptr<Connection>> conns_;

  std::mutex peers_mu_;
  std::map<std::string, std::string> token_to_peer_;
  std::map<std::string, std::string> peer_to_token_;
  std::map<BatchKey, BatchProgress> batches_;
  std::map<std::string, size_t> open_batches_;      // peer -> its entries in batches_
  uint64_t fence_epoch_ = 0;                        // bumped each time the fence moves
  std::map<std::string, size_t> live_connections_;  // peer -> its authenticated connections
  ArrivalCallback arrival_;
  LandingCallback landing_;       // guarded by peers_mu_
  PeerEndedCallback peer_ended_;  // guarded by peers_mu_
};

}  // namespace wb::transport::tcp
