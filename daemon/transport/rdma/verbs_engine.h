// The one thread that owns the rdma transport's verbs state: it creates and connects queue
// pairs, posts work requests within send-queue and completion-queue credits (queueing the rest),
// polls the completion queues (busy while work is in flight, blocked on the completion channels
// when idle) and routes each completion through a wr_id -> request map to its batch.
// Other threads hand it work through a command queue.
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
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/transport/rdma/landing_notice.h"
#include "daemon/transport/rdma/verbs.h"
#include "daemon/transport/transport.h"

namespace wb::transport::rdma {

// One NIC the transport uses (a rail): its verbs objects and the port's addressing.
struct Rail {
  std::string name;
  ContextPtr ctx;
  PdPtr pd;
  CompChannelPtr channel;
  CqPtr cq;
  uint8_t port = 1;
  int gid_index = -1;  // -1: InfiniBand (LID routed)
  ibv_gid gid{};
  uint16_t lid = 0;
  ibv_mtu mtu = IBV_MTU_1024;  // min(configured, port's active MTU)
  int cq_capacity = 0;
  int cq_used = 0;  // work requests posted on this rail that have not completed yet
};

struct EngineOptions {
  int qps_per_rail = 2;
  int send_queue_depth = 256;
  int recv_queue_depth = 64;
  uint8_t ack_timeout = 14;  // 4.096 us * 2^14 = 67 ms per try
  uint8_t retry_cnt = 7;
  std::chrono::milliseconds batch_timeout{30000};
  // While writes are in flight, spin on the completion queues for up to this long after the
  // last progress before sleeping on the completion channels: a fast NIC completes within the
  // spin (no wake-up latency), a slow link (or an oversubscribed host) does not burn a core.
  std::chrono::microseconds busy_poll{100};
  // Landing notices (landing_notice.h): bytes per notice, and notice buffers a queue pair can
  // have on the wire at once (the receive side has one per posted receive, recv_queue_depth).
  // Registered once per queue pair for local access only: nothing a peer can write by RDMA.
  size_t notice_bytes = 2048;
  int notice_send_slots = 8;
};

// Runs on the poller thread when the immediate closing a batch was polled: the ranges its
// landing notices named (the sender's word: the transport checks them against its regions).
using LandingNoticeCallback =
    std::function<void(const std::string& peer, const std::vector<LandedRange>& ranges)>;

// A fully resolved work request: addresses and keys already checked against the regions.
struct WorkRequest {
  int qp = 0;  // index into the connection's queue pairs (rail-major)
  uint64_t local_addr = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
};

// What Connect/Accept exchange about one queue pair (mirrors RdmaQpRecord).
struct QpEndpoint {
  std::string device;
  ibv_gid gid{};
  int gid_index = 0;
  uint32_t lid = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;
  ibv_mtu mtu = IBV_MTU_1024;
};

class VerbsEngine {
 public:
  VerbsEngine(std::vector<Rail> rails, EngineOptions options);
  ~VerbsEngine();
  VerbsEngine(const VerbsEngine&) = delete;
  VerbsEngine& operator=(const VerbsEngine&) = delete;

  const std::vector<Rail>& rails() const { return rails_; }  // names and addresses: immutable
  const EngineOptions& options() const { return options_; }

  struct NewConnection {
    uint64_t id = 0;
    std::vector<QpEndpoint> endpoints;  // ours, rail-major
    // Set (on the poller thread) once the connection failed; its owner may then reconnect.
    std::shared_ptr<const std::atomic<bool>> broken;
  };
  // Creates qps_per_rail queue pairs per rail in INIT state for `peer`.
  absl::StatusOr<NewConnection> CreateConnection(const std::string& peer, bool accepted);
  // Connects our queue pairs to the peer's (same count, pairwise) and posts receives.
  // `peer_notice_bytes`: the peer's landing-notice receive buffers (0: it takes none, an agent
  // without landing notices; batches to it carry only the immediate).
  absl::Status ConnectQps(uint64_t connection, const std::vector<QpEndpoint>& remote,
                          uint32_t peer_notice_bytes = 0);
  // Fails its queued batches, flushes and destroys its queue pairs.
  void DestroyConnection(uint64_t connection, const std::string& reason);
  // The connections with `peer` (empty: with anyone) on `side` (incoming: the accepted ones).
  void DestroyConnections(const std::string& peer, PeerSide side, const std::string& reason);

  // Posts `wrs` on the connection; once every one of them has completed, the batch's landing
  // notices (naming `landed`) go out as SENDs on `last`'s queue pair, then `last` as
  // RDMA_WRITE_WITH_IMM carrying EncodeBatchBytes(bytes). `done` runs once.
  void Submit(uint64_t connection, std::vector<WorkRequest> wrs, WorkRequest last, uint64_t bytes,
              std::vector<LandedRange> landed, BatchDone done);

  // Runs on the poller thread. Callbacks (this one and BatchDone) may destroy peers and
  // connections and post batches; they must not Connect or Accept (those wait for the poller).
  void SetArrivalCallback(ArrivalCallback cb);
  // Same rules as the arrival callback. Malformed or incomplete notices are logged and dropped.
  void SetLandingNoticeCallback(LandingNoticeCallback cb);

 private:
  struct PendingWr {
    uint64_t batch = 0;
    WorkRequest wr;
    bool with_imm = false;
    uint32_t imm = 0;
    std::shared_ptr<const std::string> notice;  // a SEND of these bytes (wr: only its qp)
  };
  struct QueuePair {
    // Declared before the queue pair so that it is destroyed first: receive buffers
    // [0, recv_queue_depth) then send buffers, notice_bytes each, in one local-only region.
    std::unique_ptr<uint8_t[]> notice_mem;
    MrPtr notice_mr;
    std::vector<int> free_recv_slots;
    std::vector<int> free_send_slots;
    NoticeAssembler notices;
    QpPtr qp;
    int rail = 0;
    uint32_t psn = 0;
    std::string remote_device;
    int send_used = 0;
    int recv_posted = 0;
    int recv_missing = 0;  // receives to repost when CQ credits allow
    std::deque<PendingWr> pending;
  };
  struct Connection {
    uint64_t id = 0;
    std::string peer;
    bool accepted = false;
    bool connected = false;
    bool closing = false;
    size_t notice_bytes = 0;  // per notice we send: min(ours, the peer's buffers); 0: none
    absl::Status broken;      // first fatal error; later batches fail with it
    std::shared_ptr<std::atomic<bool>> broken_flag = std::make_shared<std::atomic<bool>>(false);
    std::vector<QueuePair> qps;
  };
  struct Batch {
    uint64_t id = 0;
    uint64_t connection = 0;
    uint64_t bytes = 0;
    size_t outstanding = 0;  // posted or queued work requests, the final one excluded
    bool last_sent = false;
    PendingWr last;
    BatchDone done;
    bool finished = false;
    size_t in_flight = 0;  // posted and not completed (keeps the batch until completions drain)
    std::chrono::steady_clock::time_point deadline;
    std::vector<PendingWr> notices;  // sent right before `last`, on its queue pair
  };
  struct InflightWr {
    uint64_t batch = 0;  // 0 for receives
    uint64_t connection = 0;
    int qp = 0;
    ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
    bool recv = false;
    int slot = -1;  // the notice buffer a receive or a notice SEND uses
  };

  // Runs `fn` on the poller thread and waits (inline when already on it).
  void RunSync(std::function<void()> fn);
  // Like RunSync from other threads; from the poller thread (a callback), deferred to the next
  // loop iteration so nothing the poller is iterating over changes under it.
  void RunOrDefer(std::function<void()> fn);
  void Post(std::function<void()> fn);
  void Loop();
  bool RunCommands();
  void PostPending();
  void PostRecvs(Connection& conn, QueuePair& qp);
  int PollCompletions();
  void HandleCompletion(const ibv_wc& wc);
  void CheckDeadlines();
  void WaitForEvents(std::chrono::milliseconds max_wait);
  void FinishBatch(Batch& batch, absl::Status status);
  void BreakConnection(Connection& conn, absl::Status status);
  void ReapBatch(uint64_t batch_id);
  void ReapConnection(uint64_t connection_id);
  // Queues the batch's notices and its closing immediate on the last write's queue pair.
  void QueueClosing(Connection& conn, Batch& batch);
  uint8_t* NoticeSlot(QueuePair& qp, int slot) const {
    return qp.notice_mem.get() + static_cast<size_t>(slot) * options_.notice_bytes;
  }

  std::vector<Rail> rails_;
  const EngineOptions options_;

  // Poller-thread state.
  std::map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::unordered_map<uint64_t, Batch> batches_;
  std::unordered_map<uint64_t, InflightWr> inflight_;
  uint64_t next_connection_ = 1;
  uint64_t next_batch_ = 1;
  uint64_t next_wr_id_ = 1;
  size_t queued_wrs_ = 0;
  ArrivalCallback arrival_;
  LandingNoticeCallback landing_;
  uint64_t bad_notices_ = 0;  // logged: the first few, then every 1000th
  std::chrono::steady_clock::time_point next_deadline_check_;
  std::chrono::steady_clock::time_point last_progress_;

  // Command queue (any thread -> poller).
  std::mutex mu_;
  std::deque<std::function<void()>> commands_;
  bool stop_ = false;
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace wb::transport::rdma
