#include "daemon/transport/rdma/rdma_transport.h"

#include <spdlog/spdlog.h>

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/transport/rdma/gid.h"
#include "daemon/transport/rdma/handshake.h"
#include "daemon/transport/rdma/memory_registration.h"
#include "daemon/transport/rdma/rdma_peer.h"

namespace wb::transport::rdma {
namespace {

constexpr uint8_t kPort = 1;

std::string GidString(const ibv_gid& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2) {
    absl::StrAppend(&out, i ? ":" : "",
                    absl::Hex(gid.raw[i] << 8 | gid.raw[i + 1], absl::kZeroPad4));
  }
  return out;
}

// GB/s of one direction of the port, from its speed and width codes (ibv_query_port).
double PortGbps(const ibv_port_attr& port) {
  double lane_gbit = 2.5;
  switch (port.active_speed) {
    case 2:
      lane_gbit = 5.0;
      break;
    case 4:
    case 8:
      lane_gbit = 10.0;
      break;
    case 16:
      lane_gbit = 14.0;
      break;
    case 32:
      lane_gbit = 25.0;
      break;
    case 64:
      lane_gbit = 50.0;
      break;
    case 128:
      lane_gbit = 100.0;
      break;
  }
  int lanes = port.active_width == 2    ? 4
              : port.active_width == 4  ? 8
              : port.active_width == 8  ? 12
              : port.active_width == 16 ? 2
                                        : 1;
  return lane_gbit * lanes / 8.0;
}

absl::StatusOr<Rail> OpenRail(const std::string& name, const config::RdmaTransportConfig& config,
                              const RdmaTuning& tuning, int cq_entries) {
  auto error = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("rdma device ", name, ": ", s.message()));
  };
  Rail rail;
  rail.name = name;
  rail.port = kPort;
  absl::StatusOr<ContextPtr> ctx = OpenDevice(name);
  if (!ctx.ok()) return error(ctx.status());
  rail.ctx = std::move(*ctx);
  ibv_port_attr port{};
  if (ibv_query_port(rail.ctx.get(), kPort, &port) != 0) {
    return error(absl::InternalError("ibv_query_port(1) failed"));
  }
  if (port.state != IBV_PORT_ACTIVE) {
    return error(absl::UnavailableError(
        absl::StrCat("port 1 is not active (state ", ibv_port_state_str(port.state), ")")));
  }
  rail.lid = port.lid;
  rail.mtu = std::min(MtuFromBytes(config.mtu), port.active_mtu);
  if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
    rail.gid_index = config.gid_index;
    if (rail.gid_index < 0) {
      absl::StatusOr<GidChoice> gid = FindRoceV2Ipv4Gid(tuning.sysfs_root, name, kPort);
      if (!gid.ok()) return error(gid.status());
      rail.gid_index = gid->index;
    }
  } else {
    rail.gid_index = config.gid_index;  // InfiniBand: LID routing unless a GID is asked for
  }
  if (rail.gid_index >= 0 && ibv_query_gid(rail.ctx.get(), kPort, rail.gid_index, &rail.gid) != 0) {
    return error(
        absl::InvalidArgumentError(absl::StrCat("cannot read GID index ", rail.gid_index)));
  }
  ibv_device_attr attr{};
  if (ibv_query_device(rail.ctx.get(), &attr) == 0 && attr.max_cqe > 0) {
    cq_entries = std::min(cq_entries, attr.max_cqe);
  }
  absl::StatusOr<PdPtr> pd = CreatePd(rail.ctx.get());
  if (!pd.ok()) return error(pd.status());
  rail.pd = std::move(*pd);
  absl::StatusOr<CompChannelPtr> channel = CreateCompChannel(rail.ctx.get());
  if (!channel.ok()) return error(channel.status());
  rail.channel = std::move(*channel);
  absl::StatusOr<CqPtr> cq = CreateCq(rail.ctx.get(), cq_entries, rail.channel.get());
  if (!cq.ok()) return error(cq.status());
  rail.cq = std::move(*cq);
  rail.cq_capacity = rail.cq->cqe;
  return rail;
}

}  // namespace

void WindowSet::SplitAt(uint64_t at) {
  auto it = segments_.upper_bound(at);
  if (it == segments_.begin()) return;
  --it;
  if (it->first == at || it->second.end <= at) return;
  const Segment tail{it->second.end, it->second.count};
  it->second.end = at;
  segments_.emplace(at, tail);
}

bool WindowSet::Covers(uint64_t offset, uint64_t length) const {
  if (length == 0) return true;
  auto it = segments_.upper_bound(offset);
  if (it == segments_.begin()) return false;
  --it;
  uint64_t covered_to = it->second.end;
  const uint64_t end = offset + length;
  while (covered_to < end) {
    ++it;
    if (it == segments_.end() || it->first != covered_to) return false;
    covered_to = it->second.end;
  }
  return covered_to > offset;
}

void WindowSet::Open(uint64_t offset, uint64_t length) {
  const uint64_t end = offset + length;
  SplitAt(offset);
  SplitAt(end);
  uint64_t cursor = offset;
  for (auto it = segments_.lower_bound(offset); it != segments_.end() && it->first < end; ++it) {
    if (it->first > cursor) segments_.emplace(cursor, Segment{it->first, 1});
    ++it->second.count;
    cursor = it->second.end;
  }
  if (cursor < end) segments_.emplace(cursor, Segment{end, 1});
}

bool WindowSet::Close(uint64_t offset, uint64_t length) {
  if (length == 0 || !Covers(offset, length)) return false;
  const uint64_t end = offset + length;
  SplitAt(offset);
  SplitAt(end);
  for (auto it = segments_.lower_bound(offset); it != segments_.end() && it->first < end;) {
    it = --it->second.count == 0 ? segments_.erase(it) : std::next(it);
  }
  return true;
}

bool RdmaState::LocalCovered(uint64_t region_id, uint64_t offset, uint64_t length) const {
  std::lock_guard<std::mutex> lock(mu);
  auto it = regions.find(region_id);
  if (it == regions.end()) return false;
  return !it->second.windowed || it->second.windows.Covers(offset, length);
}

void RdmaState::IndexDestination(uint64_t id, const LocalRegion& region) {
  if (region.access != Access::kDestination) return;
  destinations.emplace(reinterpret_cast<uint64_t>(region.mem.addr), id);
  longest_destination = std::max<uint64_t>(longest_destination, region.mem.length);
}

void RdmaState::ForgetDestination(uint64_t id, const LocalRegion& region) {
  if (region.access != Access::kDestination) return;
  auto [first, last] = destinations.equal_range(reinterpret_cast<uint64_t>(region.mem.addr));
  for (auto it = first; it != last; ++it) {
    if (it->second == id) {
      destinations.erase(it);
      break;
    }
  }
  if (destinations.empty()) longest_destination = 0;  // else kept: only a bound on the walk
}

bool RdmaState::DestinationCovers(uint64_t addr, uint64_t length) const {
  if (length == 0 || addr + length < addr) return false;
  std::lock_guard<std::mutex> lock(mu);
  // Regions starting at or before `addr`, nearest first, back to the longest one's reach.
  for (auto it = destinations.upper_bound(addr); it != destinations.begin();) {
    --it;
    const uint64_t base = it->first;
    if (addr - base > longest_destination) break;
    auto r = regions.find(it->second);
    if (r == regions.end()) continue;
    const LocalRegion& region = r->second;
    if (region.mrs.empty()) continue;
    if (addr - base > region.mem.length || length > region.mem.length - (addr - base)) continue;
    if (!region.windowed || region.windows.Covers(addr - base, length)) return true;
  }
  return false;
}

absl::StatusOr<RdmaState::LocalView> RdmaState::LookupLocal(uint64_t region_id) const {
  std::lock_guard<std::mutex> lock(mu);
  auto it = regions.find(region_id);
  if (it == regions.end()) {
    return absl::NotFoundError(absl::StrCat("unknown local region ", region_id));
  }
  LocalView view;
  view.addr = reinterpret_cast<uint64_t>(it->second.mem.addr);
  view.length = it->second.mem.length;
  view.windowed = it->second.windowed;
  if (it->second.mrs.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("local region ", region_id, " has no open window (nothing registered)"));
  }
  for (const auto& mr : it->second.mrs) view.lkeys.push_back(mr->lkey);
  return view;
}

absl::StatusOr<std::unique_ptr<RdmaTransport>> RdmaTransport::Create(
    const config::RdmaTransportConfig& config, const RdmaTuning& tuning) {
  std::vector<std::string> devices = config.devices;
  if (devices.empty()) devices = ListDevices();
  if (devices.empty()) return absl::UnavailableError("not available: no RDMA device found");
  EngineOptions options;
  options.qps_per_rail = std::max(1, config.qps_per_peer);
  options.send_queue_depth = std::max(1, config.send_queue_depth);
  options.ack_timeout = tuning.ack_timeout;
  options.retry_cnt = tuning.retry_cnt;
  options.batch_timeout = tuning.batch_timeout;
  options.busy_poll = tuning.busy_poll;
  std::vector<Rail> rails;
  for (const std::string& name : devices) {
    absl::StatusOr<Rail> rail = OpenRail(name, config, tuning, 16384);
    if (!rail.ok()) {
      return absl::UnavailableError(absl::StrCat("not available: ", rail.status().message()));
    }
    rails.push_back(std::move(*rail));
  }
  auto engine = std::make_unique<VerbsEngine>(std::move(rails), options);
  auto state = std::make_shared<RdmaState>(config, std::move(engine));
  return std::unique_ptr<RdmaTransport>(new RdmaTransport(std::move(state)));
}

RdmaTransport::~RdmaTransport() {
  state_->engine->SetArrivalCallback(nullptr);
  state_->engine->SetLandingNoticeCallback(nullptr);
  state_->engine->DestroyConnections("", PeerSide::kIncoming, "rdma transport closed");
}

Capabilities RdmaTransport::caps() const {
  Capabilities caps;
  caps.gpu_memory = CudaRegistrationPossible();
  caps.remote = true;
  caps.max_write_bytes = 0;
  caps.windows = true;
  caps.rekeys = true;
  caps.reports_landing = true;  // landing notices, reported once the batch's immediate is polled
  return caps;
}

std::vector<weightbeam::v1::NicInfo> RdmaTransport::Nics() const {
  std::vector<weightbeam::v1::NicInfo> nics;
  for (const Rail& rail : state_->engine->rails()) {
    weightbeam::v1::NicInfo nic;
    nic.set_name(rail.name);
    nic.set_transport("rdma");
    nic.set_endpoint(GidString(rail.gid));
    ibv_port_attr port{};
    if (ibv_query_port(rail.ctx.get(), rail.port, &port) == 0) nic.set_gbps(PortGbps(port));
    int numa = -1;
    std::ifstream in("/sys/class/infiniband/" + rail.name + "/device/numa_node");
    if (in >> numa) nic.set_numa_node(numa);
    nics.push_back(nic);
  }
  return nics;
}

absl::StatusOr<std::vector<MrPtr>> RdmaTransport::RegisterMrs(const MemoryRef& mem, Access access) {
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if (access == Access::kDestination) flags |= IBV_ACCESS_REMOTE_WRITE;
  std::vector<MrPtr> mrs;
  const std::vector<Rail>& rails = state_->engine->rails();
  for (size_t i = 0; i < rails.size(); ++i) {
    const Rail& rail = rails[i];
    // Registrations that came back with an rkey revoked before stay registered until this one
    // is done, so the HCA cannot hand the same key out again at once.
    std::vector<MrPtr> aside;
    for (int draw = 0;; ++draw) {
      absl::StatusOr<MrPtr> mr = RegisterMemory(rail.pd.get(), mem, flags);
      if (!mr.ok() && IsDeclined(mr.status())) {
        return DeclineRegion(absl::StrCat(mr.status().message(), " (on ", rail.name, ")"));
      }
      if (!mr.ok()) {
        return absl::Status(mr.status().code(),
                            absl::StrCat("registering ", mem.length, " bytes on ", rail.name, ": ",
                                         mr.status().message()));
      }
      bool revoked;
      {
        std::lock_guard<std::mutex> lock(revoked_mu_);
        revoked = i < revoked_.size() && revoked_[i].count((*mr)->rkey) > 0;
      }
      if (!revoked) {
        mrs.push_back(std::move(*mr));
        break;
      }
      if (draw + 1 >= kMaxRedraws) {
        return absl::UnavailableError(absl::StrCat(
            "registering ", mem.length, " bytes on ", rail.name, ": ", kMaxRedraws,
            " registrations in a row came back with an rkey this agent revoked before"));
      }
      aside.push_back(std::move(*mr));
    }
  }
  return mrs;
}

void RdmaTransport::Revoked(const std::vector<MrPtr>& mrs) {
  std::lock_guard<std::mutex> lock(revoked_mu_);
  if (revoked_.size() < mrs.size()) revoked_.resize(mrs.size());
  for (size_t i = 0; i < mrs.size(); ++i) {
    if (!mrs[i] || !revoked_[i].insert(mrs[i]->rkey).second) continue;
    revoked_order_.emplace_back(i, mrs[i]->rkey);
  }
  while (revoked_order_.size() > kMaxRevoked) {
    revoked_[revoked_order_.front().first].erase(revoked_order_.front().second);
    revoked_order_.pop_front();
  }
}

weightbeam::v1::RegionDescriptor RdmaTransport::Describe(const std::vector<Rail>& rails,
                                                         uint64_t id,
                                                         const RdmaState::LocalRegion& region) {
  weightbeam::v1::RegionDescriptor desc;
  desc.set_region_id(id);
  desc.set_length(region.mem.length);
  for (size_t i = 0; i < rails.size(); ++i) {
    auto* key = desc.add_keys();
    key->set_transport("rdma");
    key->set_device(rails[i].name);
    key->set_address(reinterpret_cast<uint64_t>(region.mem.addr));
    // No memory region (a destination buffer with no open window): key 0, refused by the
    // sender's own checks as much as by the NIC (no region carries it here).
    const bool keyed = region.access == Access::kDestination && i < region.mrs.size();
    key->set_key(keyed ? region.mrs[i]->rkey : 0);
  }
  return desc;
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> RdmaTransport::AddRegion(const MemoryRef& mem,
                                                                          Access access,
                                                                          bool windowed) {
  if (mem.addr == nullptr || mem.length == 0) {
    return absl::InvalidArgumentError("rdma: cannot register an empty memory range");
  }
  RdmaState::LocalRegion region;
  region.mem = mem;
  region.access = access;
  region.windowed = windowed;
  absl::StatusOr<std::vector<MrPtr>> mrs = RegisterMrs(mem, access);
  if (!mrs.ok()) return mrs.status();
  region.mrs = std::move(*mrs);
  std::lock_guard<std::mutex> lock(state_->mu);
  uint64_t id = state_->next_region++;
  weightbeam::v1::RegionDescriptor desc = Describe(state_->engine->rails(), id, region);
  state_->IndexDestination(id, region);
  state_->regions[id] = std::move(region);
  return desc;
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> RdmaTransport::Register(const MemoryRef& mem,
                                                                         Access access) {
  return AddRegion(mem, access, /*windowed=*/false);
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> RdmaTransport::RegisterBuffer(const MemoryRef& mem,
                                                                               Access access) {
  return AddRegion(mem, access, /*windowed=*/true);
}

absl::Status RdmaTransport::OpenWindow(uint64_t region_id, uint64_t offset, uint64_t length) {
  bool unregistered = false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->regions.find(region_id);
    if (it == state_->regions.end()) {
      return absl::NotFoundError(absl::StrCat("rdma: unknown region ", region_id));
    }
    RdmaState::LocalRegion& region = it->second;
    if (!region.windowed || length == 0 || offset > region.mem.length ||
        length > region.mem.length - offset) {
      return absl::InvalidArgumentError(absl::StrCat("rdma: window [", offset, ", +", length,
                                                     ") does not fit buffer region ", region_id,
                                                     " (length ", region.mem.length, ")"));
    }
    region.windows.Open(offset, length);
    unregistered = region.mrs.empty();
  }
  // A destination buffer whose windows had all closed holds no memory region: register it
  // again (new rkeys; the caller reads them with BufferKeys).
  return unregistered ? Rekey(region_id) : absl::OkStatus();
}

absl::Status RdmaTransport::CloseWindow(uint64_t region_id, uint64_t offset, uint64_t length) {
  return CloseWindows(region_id, {{offset, length}});
}

absl::Status RdmaTransport::CloseWindows(
    uint64_t region_id, const std::vector<std::pair<uint64_t, uint64_t>>& windows) {
  bool revoke = false;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->regions.find(region_id);
    if (it == state_->regions.end()) {
      return absl::NotFoundError(absl::StrCat("rdma: unknown region ", region_id));
    }
    RdmaState::LocalRegion& region = it->second;
    for (const auto& [offset, length] : windows) {
      if (!region.windowed || length == 0 || offset > region.mem.length ||
          length > region.mem.length - offset || !region.windows.Close(offset, length)) {
        if (status.ok()) {
          status = absl::InvalidArgumentError(absl::StrCat("rdma: no open window [", offset, ", +",
                                                           length, ") in region ", region_id));
        }
        continue;
      }
      // Bytes another window still covers (a replica's copy) stay writable.
      revoke = revoke || !region.windows.Covers(offset, length);
    }
    // Sources grant no remote access: their windows bound local reads only.
    revoke = revoke && region.access == Access::kDestination;
  }
  if (!revoke) return status;
  absl::Status rekeyed = Rekey(region_id);
  return status.ok() ? rekeyed : status;
}

absl::Status RdmaTransport::Rekey(uint64_t region_id) {
  MemoryRef mem;
  Access access;
  bool keep = false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->regions.find(region_id);
    if (it == state_->regions.end()) {
      return absl::NotFoundError(absl::StrCat("rdma: unknown region ", region_id));
    }
    mem = it->second.mem;
    access = it->second.access;
    keep = !it->second.windows.empty();
  }
  // The new regions first (the buffer's other tensors stay reachable under the new rkeys),
  // then the old ones go: ibv_dereg_mr returns once the NIC can no longer write through them.
  // Callers (the registry) serialize window changes of one buffer.
  std::vector<MrPtr> fresh;
  absl::Status status;
  if (keep) {
    absl::StatusOr<std::vector<MrPtr>> mrs = RegisterMrs(mem, access);
    if (mrs.ok()) {
      fresh = std::move(*mrs);
      rekeys_.fetch_add(1, std::memory_order_relaxed);
    } else {
      // Fail closed: the old rkeys are revoked below all the same, and the buffer's live
      // tensors are unreachable over rdma until a window opens again.
      status = absl::Status(mrs.status().code(),
                            absl::StrCat("rdma: re-registering buffer region ", region_id,
                                         " after closing a window: ", mrs.status().message(),
                                         " (its old rkeys are revoked)"));
    }
  }
  std::vector<MrPtr> old;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->regions.find(region_id);
    if (it == state_->regions.end()) {
      return absl::NotFoundError(absl::StrCat("rdma: unknown region ", region_id));
    }
    old = std::exchange(it->second.mrs, std::move(fresh));
  }
  Revoked(old);  // never taken again by a later registration
  old.clear();   // ibv_dereg_mr: the old rkeys are invalid from here on
  return status;
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> RdmaTransport::BufferKeys(uint64_t region_id) {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->regions.find(region_id);
  if (it == state_->regions.end()) {
    return absl::NotFoundError(absl::StrCat("rdma: unknown region ", region_id));
  }
  return Describe(state_->engine->rails(), region_id, it->second);
}

uint64_t RdmaTransport::rekeys() const { return rekeys_.load(std::memory_order_relaxed); }

absl::Status RdmaTransport::Deregister(uint64_t region_id) {
  RdmaState::LocalRegion region;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->regions.find(region_id);
    if (it == state_->regions.end()) {
      return absl::NotFoundError(absl::StrCat("rdma: unknown region ", region_id));
    }
    region = std::move(it->second);
    state_->ForgetDestination(region_id, region);
    state_->regions.erase(it);
  }
  if (region.access == Access::kDestination) Revoked(region.mrs);
  region.mrs.clear();  // ibv_dereg_mr: the rkeys are invalid from here on
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Peer>> RdmaTransport::Connect(const std::string& our_name,
                                                             const std::string& peer_name,
                                                             const HandshakeExchange& exchange) {
  absl::StatusOr<Handshaken> connected =
      ConnectToPeer(*state_->engine, our_name, peer_name, exchange);
  if (!connected.ok()) return connected.status();
  return std::shared_ptr<Peer>(
      std::make_shared<RdmaPeer>(state_, our_name, peer_name, exchange, std::move(*connected)));
}

absl::StatusOr<std::string> RdmaTransport::Accept(const std::string& peer_name,
                                                  const std::string& their_record) {
  return AcceptPeer(*state_->engine, peer_name, their_record);
}

void RdmaTransport::ForgetPeer(const std::string& peer_name, PeerSide side) {
  state_->engine->DestroyConnections(peer_name, side, "peer '" + peer_name + "' forgotten");
}

void RdmaTransport::CutIncoming(const std::string& why) {
  spdlog::warn(
      "rdma transport: {}: destroying every incoming queue pair (one-sided writes "
      "cannot be refused by step)",
      why);
  state_->engine->DestroyConnections("", PeerSide::kIncoming, why);
}

absl::Status RdmaTransport::OpenStep(uint64_t step) {
  std::lock_guard<std::mutex> lock(fence_mu_);
  if (step_open_) CutIncoming(absl::StrCat("step ", step, " begins before the last one ended"));
  step_open_ = true;
  return absl::OkStatus();
}

absl::Status RdmaTransport::CloseStep(bool committed) {
  std::lock_guard<std::mutex> lock(fence_mu_);
  if (step_open_ && !committed) CutIncoming("the step was aborted");
  step_open_ = false;
  return absl::OkStatus();
}

void RdmaTransport::SetArrivalCallback(ArrivalCallback cb) {
  state_->engine->SetArrivalCallback(std::move(cb));
}

void RdmaTransport::SetLandingCallback(LandingCallback cb) {
  if (!cb) {
    state_->engine->SetLandingNoticeCallback(nullptr);
    return;
  }
  // The engine lives inside the state and joins its poller before the state's members go.
  RdmaState* state = state_.get();
  state_->engine->SetLandingNoticeCallback(
      [state, ignored = ignored_landings_, cb = std::move(cb)](
          const std::string& peer, const std::vector<LandedRange>& ranges) {
        for (const LandedRange& r : ranges) {
          if (state->DestinationCovers(r.addr, r.length)) {
            cb(r.step, reinterpret_cast<const void*>(r.addr), r.length);
            continue;
          }
          if (ignored->fetch_add(1) % 1000 == 0) {
            spdlog::warn(
                "rdma: peer '{}' reported bytes landed at [{:#x}, +{}) of step {}, outside "
                "this agent's destination memory: ignored",
                peer, r.addr, r.length, r.step);
          }
        }
      });
}

uint64_t RdmaTransport::ignored_landings() const { return ignored_landings_->load(); }

absl::StatusOr<std::unique_ptr<Transport>> MakeRdmaTransport(const config::AgentConfig& config) {
  RdmaTuning tuning;
  if (config.executor.write_timeout_ms > 0) {
    tuning.batch_timeout = std::chrono::milliseconds(config.executor.write_timeout_ms);
  }
  absl::StatusOr<std::unique_ptr<RdmaTransport>> transport =
      RdmaTransport::Create(config.rdma, tuning);
  if (!transport.ok()) return transport.status();
  return std::unique_ptr<Transport>(std::move(*transport));
}

}  // namespace wb::transport::rdma
