// The "rdma" transport: one-sided RDMA WRITEs over RC queue pairs (rdma-core verbs), several
// queue pairs per peer on several NICs (rails). Queue-pair setup records travel through the
// caller's handshake exchange; a single poller thread (VerbsEngine) owns all verbs state.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "daemon/transport/rdma/verbs_engine.h"
#include "daemon/transport/transport.h"

namespace wb::transport::rdma {

// The windows open on a buffer region (its live tensors), counted: two tensors may share bytes
// (replicas, views). Segments are disjoint, keyed by start, and hold a count > 0.
class WindowSet {
 public:
  void Open(uint64_t offset, uint64_t length);
  // False (and nothing changed) unless every byte of the range is inside an open window.
  bool Close(uint64_t offset, uint64_t length);
  bool Covers(uint64_t offset, uint64_t length) const;
  bool empty() const { return segments_.empty(); }

 private:
  struct Segment {
    uint64_t end = 0;
    int count = 0;
  };
  void SplitAt(uint64_t at);
  std::map<uint64_t, Segment> segments_;
};

// Knobs that are not part of the user-facing configuration.
struct RdmaTuning {
  // A batch that has not completed by then fails (a vanished peer also fails it earlier, through
  // the queue pair's ack timeout and retries: about 0.5 s with the defaults).
  std::chrono::milliseconds batch_timeout{30000};
  uint8_t ack_timeout = 14;
  uint8_t retry_cnt = 7;
  std::chrono::microseconds busy_poll{100};  // see EngineOptions::busy_poll
  std::string sysfs_root = "/sys/class/infiniband";
};

// What the transport and its peers share: the poller (with the rails' verbs objects) and the
// local regions. Peers keep it alive, so a peer may outlive the transport object.
class RdmaState {
 public:
  RdmaState(config::RdmaTransportConfig config, std::unique_ptr<VerbsEngine> engine)
      : config(std::move(config)), engine(std::move(engine)) {}
  ~RdmaState() {
    regions.clear();  // memory regions before the protection domains in the engine's rails
    engine.reset();
  }

  // A local region's address and per-rail lkeys, for building work requests.
  struct LocalView {
    uint64_t addr = 0;
    uint64_t length = 0;
    std::vector<uint32_t> lkeys;  // per rail
    bool windowed = false;        // a buffer: check LocalCovered per write
  };
  absl::StatusOr<LocalView> LookupLocal(uint64_t region_id) const;
  // For a buffer region: whether [offset, offset + length) lies inside its open windows (live
  // tensors); any other region: true.
  bool LocalCovered(uint64_t region_id, uint64_t offset, uint64_t length) const;
  // Whether [addr, addr + length) lies inside one of this process's destination regions, and
  // for a buffer region inside its open windows: a landing notice naming anything else is a
  // peer's mistake or lie, and is not reported.
  bool DestinationCovers(uint64_t addr, uint64_t length) const;

  struct LocalRegion {
    MemoryRef mem;
    Access access = Access::kSource;
    std::vector<MrPtr> mrs;  // per rail; none for a destination buffer with no open window
    // A buffer registered once for its tensors (RegisterBuffer): only the bytes of its open
    // windows may be read locally; a destination buffer is registered afresh (new rkeys) when
    // a window closes, since the NIC admits any write under a valid rkey.
    bool windowed = false;
    WindowSet windows;
  };

  const config::RdmaTransportConfig config;
  std::unique_ptr<VerbsEngine> engine;
  mutable std::mutex mu;
  std::map<uint64_t, LocalRegion> regions;
  // The destination regions by first byte (guarded by mu), and the longest of them:
  // DestinationCovers runs on the poller thread once per landed range, so it looks up the few
  // regions that may hold an address instead of walking every region (issue 41, item 11).
  std::multimap<uint64_t, uint64_t> destinations;
  uint64_t longest_destination = 0;
  void IndexDestination(uint64_t id, const LocalRegion& region);
  void ForgetDestination(uint64_t id, const LocalRegion& region);
  uint64_t next_region = 1;
};

class RdmaTransport : public Transport {
 public:
  // Fails with UNAVAILABLE "not available: no RDMA device found" on hosts without RDMA devices,
  // and names the device when a configured one is missing or unusable.
  static absl::StatusOr<std::unique_ptr<RdmaTransport>> Create(
      const config::RdmaTransportConfig& config, const RdmaTuning& tuning = {});
  ~RdmaTransport() override;

  std::string Name() const override { return "rdma"; }
  Capabilities caps() const override;
  std::vector<weightbeam::v1::NicInfo> Nics() const override;

  absl::StatusOr<weightbeam::v1::RegionDescriptor> Register(const MemoryRef& mem,
                                                            Access access) override;
  absl::Status Deregister(uint64_t region_id) override;
  // One memory region per rail for a whole buffer (a shared-memory mapping, a CUDA allocation).
  // Tensors are windows of it; the rkey of a tensor is its buffer's. Closing a destination
  // window that leaves bytes uncovered re-registers the buffer (new rkeys, the old ones fail
  // remotely with a remote access error) before it returns; closing the last one deregisters
  // it. docs/security.md "One registration per buffer".
  absl::StatusOr<weightbeam::v1::RegionDescriptor> RegisterBuffer(const MemoryRef& mem,
                                                                  Access access) override;
  absl::Status OpenWindow(uint64_t region_id, uint64_t offset, uint64_t length) override;
  absl::Status CloseWindow(uint64_t region_id, uint64_t offset, uint64_t length) override;
  absl::Status CloseWindows(uint64_t region_id,
                            const std::vector<std::pair<uint64_t, uint64_t>>& windows) override;
  absl::StatusOr<weightbeam::v1::RegionDescriptor> BufferKeys(uint64_t region_id) override;
  // Registrations made by re-keying buffers since start (tests, register_bench).
  uint64_t rekeys() const;

  absl::StatusOr<std::shared_ptr<Peer>> Connect(const std::string& our_name,
                                                const std::string& peer_name,
                                                const HandshakeExchange& exchange) override;
  absl::StatusOr<std::string> Accept(const std::string& peer_name,
                                     const std::string& their_record) override;
  void ForgetPeer(const std::string& peer_name, PeerSide side = PeerSide::kBoth) override;
  // Runs on the poller thread: it must not call back into the transport synchronously.
  void SetArrivalCallback(ArrivalCallback cb) override;
  // Runs on the poller thread when the immediate closing a batch is polled, once per range its
  // landing notices named (landing_notice.h) that lies inside our destination memory
  // (DestinationCovers); ranges outside it are dropped and counted (ignored_landings()).
  void SetLandingCallback(LandingCallback cb) override;
  uint64_t ignored_landings() const;

  // RDMA WRITEs are one-sided and carry no step, so the receiver cannot refuse one by its
  // step. It fences by connection instead: when a step ends without a commit (abort), or a new
  // step begins while the previous one was never closed (it timed out), every incoming queue
  // pair is destroyed before the call returns; the senders connect afresh for the next step,
  // and nothing the old queue pairs still carry can land.
  absl::Status OpenStep(uint64_t step) override;
  absl::Status CloseStep(bool committed) override;
  uint64_t RefusedWrites(uint64_t) const override { return 0; }  // cannot tell
  void SetFenceCallback(FenceCallback) override {}

 private:
  explicit RdmaTransport(std::shared_ptr<RdmaState> state) : state_(std::move(state)) {}
  void CutIncoming(const std::string& why);
  // One memory region per rail over `mem`.
  absl::StatusOr<std::vector<MrPtr>> RegisterMrs(const MemoryRef& mem, Access access);
  absl::StatusOr<weightbeam::v1::RegionDescriptor> AddRegion(const MemoryRef& mem, Access access,
                                                             bool windowed);
  // Replaces a destination buffer's memory regions: fresh ones when windows remain open, none
  // otherwise; the old ones are deregistered (their rkeys revoked) before it returns.
  absl::Status Rekey(uint64_t region_id);
  static weightbeam::v1::RegionDescriptor Describe(const std::vector<Rail>& rails, uint64_t id,
                                                   const RdmaState::LocalRegion& region);

  std::shared_ptr<RdmaState> state_;
  std::mutex fence_mu_;
  bool step_open_ = false;  // guarded by fence_mu_
  std::atomic<uint64_t> rekeys_{0};
  // The rkeys this transport revoked, per rail (the last kMaxRevoked): the HCA may hand a freed
  // rkey out again (rxe: a region's pool index comes back with one of 256 key bytes), and a
  // sender still holding a revoked one must never write through it again (issue 41, item 12).
  // A registration that comes back with one is kept aside until another is drawn.
  static constexpr size_t kMaxRevoked = 1 << 16;
  static constexpr int kMaxRedraws = 64;
  void Revoked(const std::vector<MrPtr>& mrs);
  std::mutex revoked_mu_;
  std::vector<std::set<uint32_t>> revoked_;                // by rail; guarded by revoked_mu_
  std::deque<std::pair<size_t, uint32_t>> revoked_order_;  // oldest first; revoked_mu_
  std::shared_ptr<std::atomic<uint64_t>> ignored_landings_ =
      std::make_shared<std::atomic<uint64_t>>(0);
};

// The factory's entry (daemon/transport/factory.cc): config.rdma, with
// config.executor.write_timeout_ms as the batch timeout.
absl::StatusOr<std::unique_ptr<Transport>> MakeRdmaTransport(const config::AgentConfig& config);

}  // namespace wb::transport::rdma
