// The sending half of the tcp transport: one peer = N TCP connections, each with a sender
// thread (frames out) and an acknowledgement reader. A batch is split across the connections,
// each share ends with a FLUSH; the batch completes when every share is acknowledged, and
// fails on the first NACK, a lost connection, or when nothing moves for the write timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/net/socket_util.h"
#include "daemon/gpu/staging.h"
#include "daemon/transport/region_table.h"
#include "daemon/transport/tcp/frame.h"
#include "daemon/transport/tcp/tcp_options.h"
#include "daemon/transport/transport.h"

namespace wb::transport::tcp {

class TcpPeer : public Peer {
 public:
  // Opens `options.connections_per_peer` connections to `endpoint` and presents `token` on
  // each. `max_frame_bytes` is the receiver's limit (we split writes to fit it).
  static absl::StatusOr<std::shared_ptr<TcpPeer>> Connect(
      std::string our_name, std::string peer_name, const std::string& endpoint,
      const std::string& token, uint64_t max_frame_bytes, std::shared_ptr<RegionTable> regions,
      const TcpOptions& options);
  // Do not drop the last reference from inside a BatchDone callback: the destructor joins
  // the transport threads.
  ~TcpPeer() override;

  const std::string& name() const override { return peer_name_; }
  absl::Status AddRemoteRegion(const weightbeam::v1::RegionDescriptor& region) override;
  void RemoveRemoteRegion(uint64_t region_id) override;
  void PostBatch(std::vector<WriteOp> ops, BatchDone done) override;
  // Closes the peer (what is queued fails now, nothing more is sent on these connections).
  void Abandon(const std::string& reason) override { Close(reason); }

  // Fails what is in flight with `reason` and closes the connections; later batches fail.
  void Close(const std::string& reason);

 private:
  struct Batch;
  struct Chunk {
    uint64_t local_region;
    uint64_t local_offset;
    uint64_t remote_region;
    uint64_t remote_key;
    uint64_t remote_offset;
    uint64_t length;
    uint64_t step;
  };
  struct Job {  // one connection's share of a batch
    std::shared_ptr<Batch> batch;
    std::vector<Chunk> chunks;
    int conn = 0;
    uint32_t parts = 0;
    uint64_t bytes = 0;
  };
  struct Connection {
    int index = 0;
    net::UniqueFd fd;
    std::thread sender;
    std::thread acker;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;  // waiting to be sent
    bool sending = false;  // a job is on the wire (by `sender` or a caller sending inline)
    std::atomic<uint64_t> unsent{0};  // bytes of the jobs queued or being sent (Split)
    std::deque<std::shared_ptr<Batch>> awaiting_ack;  // FLUSH sent, in order
    bool closed = false;
    gpu::LazyStaging staging;  // pinned ring for GPU sources, used by whoever is `sending`
  };
  struct RemoteRegion {
    uint64_t key = 0;
    uint64_t length = 0;
  };

  TcpPeer(std::string our_name, std::string peer_name, std::string endpoint,
          uint64_t max_frame_bytes, std::shared_ptr<RegionTable> regions,
          const TcpOptions& options);
  absl::Status OpenConnections(const std::string& token);
  void Start();

  absl::Status Validate(const std::vector<WriteOp>& ops, std::vector<Chunk>* chunks,
                        uint64_t* total);
  std::vector<Job> Split(const std::shared_ptr<Batch>& batch, const std::vector<Chunk>& chunks,
                         uint64_t total) const;
  void SendLoop(Connection* conn);
  // A small job on an idle connection (nothing queued, sending or unacknowledged) goes out on
  // the caller's thread: no hand-off to the sender thread (one wake-up less for a step's lone
  // batch to a peer).
  void SendInline(Connection* conn, Job job);
  // `inline_caller`: failures finish the batch from the monitor thread (`done` never runs
  // inside PostBatch).
  absl::Status SendJob(Connection* conn, Job& job, bool inline_caller);
  // Chunks [first, end) of a share that can go as one WRITE frame: rows of at most 64 KiB
  // from one local region, in order, landing back to back in one remote region (end is
  // first + 1 when the row at `first` goes alone).
  size_t GatherEnd(const std::vector<Chunk>& chunks, size_t first) const;
  // Sends chunks [first, end) as one WRITE frame (header: batch id from `header`) gathered
  // from `src` (the first chunk's local bytes; the others at their offsets from it), followed
  // by the FLUSH `flush` when not null.
  absl::Status SendGathered(Connection* conn, const std::vector<Chunk>& chunks, size_t first,
                            size_t end, const uint8_t* src, FrameHeader header, uint8_t* flush);
  void AckLoop(Connection* conn);
  // Marks the connection (and so the peer) broken, fails its batches.
  void FailConnection(Connection* conn, const absl::Status& status);
  void Finish(const std::shared_ptr<Batch>& batch, absl::Status status);
  void MonitorLoop();
  void Defer(std::function<void()> fn);
  std::string Where() const;  // "tcp peer 'name' (host:port)"

  const std::string our_name_;
  const std::string peer_name_;
  const std::string endpoint_;
  const uint64_t max_frame_bytes_;
  const std::shared_ptr<RegionTable> regions_;
  const TcpOptions options_;
  std::vector<std::unique_ptr<Connection>> conns_;
  // steady_clock nanoseconds of the last byte sent or acknowledgement received.
  std::atomic<int64_t> last_progress_ns_{0};

  std::mutex remote_mu_;
  absl::flat_hash_map<uint64_t, RemoteRegion> remote_regions_;  // 10^6 for a big plan

  std::mutex state_mu_;  // guards everything below
  std::condition_variable state_cv_;
  bool stopping_ = false;
  absl::Status broken_;  // first connection failure; later batches fail with it
  uint64_t next_batch_id_ = 1;
  std::map<uint64_t, std::shared_ptr<Batch>> active_;
  std::deque<std::function<void()>> deferred_;
  std::thread monitor_;
};

}  // namespace wb::transport::tcp
