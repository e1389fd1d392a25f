// The data-plane interface every backend (rdma, tcp, local) implements: register memory,
// connect to a peer through a small handshake record, and post batches of one-sided writes.
// Control-plane code (gRPC) stays outside: the handshake exchange is a callback.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::transport {

enum class MemoryKind { kHost, kCuda };

// What a region is for: sources are only read locally; destinations may be written by peers.
enum class Access { kSource, kDestination };

struct MemoryRef {
  void* addr = nullptr;
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // CUDA device for kCuda
};

struct Capabilities {
  bool gpu_memory = false;       // can register CUDA memory
  bool remote = true;            // can reach other nodes (false for local)
  uint64_t max_write_bytes = 0;  // 0: no limit (large writes are chunked internally)
  // Registers a whole buffer once and admits remote writes only inside the windows opened on
  // it (RegisterBuffer / OpenWindow / CloseWindow): tcp, local and rdma.
  bool windows = false;
  // With windows: closing a window revokes its bytes by registering the buffer afresh (rdma: the
  // NIC checks only the memory region), so the buffer's keys change on CloseWindow(s) and
  // OpenWindow; read them again with BufferKeys. tcp and local refuse per window, keys stay.
  bool rekeys = false;
  // Calls the landing callback for every write that lands (SetLandingCallback): tcp, local,
  // rdma.
  bool reports_landing = false;
};

// A one-sided write: `length` bytes from a local region into a remote region.
struct WriteOp {
  uint64_t local_region = 0;
  uint64_t local_offset = 0;
  uint64_t remote_region = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
  // The step this write belongs to: the receiver refuses it unless that step is the one it
  // began (see Transport::OpenStep).
  uint64_t step = 0;
};

// Which of a peer's connections: ours to it (outgoing) or its to us (incoming).
enum class PeerSide { kBoth, kOutgoing, kIncoming };

using BatchDone = std::function<void(absl::Status)>;

// A connection to one peer agent (several queue pairs / sockets underneath).
class Peer {
 public:
  virtual ~Peer() = default;
  virtual const std::string& name() const = 0;
  // Makes a peer's destination region targetable: the keys in `region` for this transport.
  virtual absl::Status AddRemoteRegion(const weightbeam::v1::RegionDescriptor& region) = 0;
  virtual void RemoveRemoteRegion(uint64_t region_id) = 0;
  // Posts the writes; `done` runs exactly once, on a transport thread, when all have landed
  // or the first has failed (the error names the peer, device and operation). Bounds are
  // checked against the local and remote regions before anything is posted.
  virtual void PostBatch(std::vector<WriteOp> ops, BatchDone done) = 0;
  // Convenience: PostBatch and wait, failing with DEADLINE_EXCEEDED after `timeout`.
  absl::Status WriteBatch(std::vector<WriteOp> ops, std::chrono::milliseconds timeout);
  // The step these batches belong to was given up: batches not yet on the wire fail now
  // instead of being sent late (tcp: the connections are closed; later batches fail until the
  // next connect). Default: nothing queued to cancel.
  virtual void Abandon(const std::string& reason) {}
};

// Sends our handshake record to the peer (over the control plane) and returns theirs.
using HandshakeExchange = std::function<absl::StatusOr<std::string>(const std::string& our_record)>;

// Called on the receiving side when a batch from `peer` has fully landed.
using ArrivalCallback = std::function<void(const std::string& peer, uint64_t batch_bytes)>;
// Called on the receiving side for each write that has landed, with where it landed in this
// process's memory (a relay forwards bytes once they are in: executor/landing_tracker.h).
using LandingCallback = std::function<void(uint64_t step, const void* addr, uint64_t length)>;
// Called on the receiving side when the last connection a peer opened to us has ended (it died,
// or gave its writes up): bytes a relay still waits for from it will not come.
using PeerEndedCallback = std::function<void(const std::string& peer)>;
// Called on the receiving side for each write refused by the step fence.
using FenceCallback = std::function<void(const std::string& peer, uint64_t step)>;

// A transport that cannot register one region (GPU memory it cannot pin here: rdma without
// dma-buf or nvidia-peermem) while the others can returns DeclineRegion(why) from Register: the
// registry then registers the tensor with the other transports (RegisteredTensor::declined
// keeps why), and a route that needs this transport fails naming it. Any other error fails
// the registration on every transport.
absl::Status DeclineRegion(const std::string& why);
bool IsDeclined(const absl::Status& status);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string Name() const = 0;  // "rdma", "tcp", "local"
  virtual Capabilities caps() const = 0;
  // Per-device descriptions for the controller (name, endpoint, bandwidth).
  virtual std::vector<weightbeam::v1::NicInfo> Nics() const = 0;

  // Registers memory and returns its descriptor (region id + keys for each device). Only
  // kDestination regions accept remote writes.
  virtual absl::StatusOr<weightbeam::v1::RegionDescriptor> Register(const MemoryRef& mem,
                                                                    Access access) = 0;
  // Revokes the region's keys; when it returns, no remote write into it can land any more.
  virtual absl::Status Deregister(uint64_t region_id) = 0;

  // Transports with caps().windows: registers a buffer (a shared-memory object, a CUDA
  // allocation) once for all the tensors inside it. Remote writes land only inside the windows
  // opened on it, one per live tensor; the buffer's key is every tensor's key.
  virtual absl::StatusOr<weightbeam::v1::RegionDescriptor> RegisterBuffer(const MemoryRef& mem,
                                                                          Access access);
  virtual absl::Status OpenWindow(uint64_t region_id, uint64_t offset, uint64_t length);
  // When it returns, no remote write into [offset, offset + length) can land any more, unless
  // another window still covers those bytes (a replicated tensor's copy).
  virtual absl::Status CloseWindow(uint64_t region_id, uint64_t offset, uint64_t length);
  // Closes several windows of one buffer at once (a session's withdrawal): a transport that
  // rekeys does it once for all of them. Default: CloseWindow for each.
  virtual absl::Status CloseWindows(uint64_t region_id,
                                    const std::vector<std::pair<uint64_t, uint64_t>>& windows);
  // A buffer region's current keys (region id, length, one key per device), for transports
  // with caps().rekeys.
  virtual absl::StatusOr<weightbeam::v1::RegionDescriptor> BufferKeys(uint64_t region_id);

  // Initiator side: build our record, exchange it, finish the connection.
  virtual absl::StatusOr<std::shared_ptr<Peer>> Connect(const std::string& our_name,
                                                        const std::string& peer_name,
                                                        const HandshakeExchange& exchange) = 0;
  // Acceptor side: given the initiator's record, prepare to accept it and return our record.
  virtual absl::StatusOr<std::string> Accept(const std::string& peer_name,
                                             const std::string& their_record) = 0;
  // Forget a peer (it left or the layout changed): the connections we opened to it, the ones
  // it opened to us (its keys for our regions are revoked), or both. Two agents may send to
  // each other, so reconnecting one direction must leave the other alone.
  virtual void ForgetPeer(const std::string& peer_name, PeerSide side = PeerSide::kBoth) = 0;

  virtual void SetArrivalCallback(ArrivalCallback cb) = 0;
  // Transports report each write that has landed here: tcp and local as they place it, rdma
  // (one-sided writes land unseen) once the immediate closing the batch is polled, for the
  // ranges its landing notices name (rdma/landing_notice.h).
  virtual void SetLandingCallback(LandingCallback cb) {}
  // Transports with connections of their own (tcp) report a peer's last incoming one ending.
  virtual void SetPeerEndedCallback(PeerEndedCallback cb) {}

  // The receiving side's step fence (docs/security.md, class 8). Until the first OpenStep or
  // CloseStep the fence is not armed and every write is accepted (a bare transport); once
  // armed, only writes tagged with the open step land, the others are refused untouched.
  // Both return once no write admitted before the call can still land (writes in flight are
  // interrupted), or fail when that cannot be made sure of.
  virtual absl::Status OpenStep(uint64_t step) = 0;
  // `committed`: the step ended well. An aborted or unfinished step's senders may still be
  // writing; transports that cannot tag writes (rdma) cut their connections here.
  virtual absl::Status CloseStep(bool committed) = 0;
  // Writes tagged `step` refused so far (a step with refused writes must not commit).
  virtual uint64_t RefusedWrites(uint64_t step) const = 0;
  virtual void SetFenceCallback(FenceCallback cb) = 0;
};

}  // namespace wb::transport
