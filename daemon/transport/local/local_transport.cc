#include "daemon/transport/local/local_transport.h"

#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/transport/gpu_memory.h"
#include "daemon/transport/local/guarded_copy.h"
#include "daemon/transport/region_table.h"
#include "daemon/transport/step_fence.h"

namespace wb::transport::local {

// Owns the region table and the copy thread, so that `done` runs on a transport thread and
// PostBatch never blocks its caller.
class LocalEngine {
 public:
  LocalEngine() : regions_("local"), worker_([this] { Run(); }) {}
  ~LocalEngine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  RegionTable& regions() { return regions_; }
  // The receiving side's step fence, checked in-process before each copy.
  StepFence& fence() { return fence_; }
  // GPU copies; used only on the worker thread (the staging ring is single-threaded).
  DeviceCopies& device_copies() { return *device_copies_; }

  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

  void SetArrival(ArrivalCallback cb) {
    std::lock_guard<std::mutex> lock(mu_);
    arrival_ = std::move(cb);
  }
  ArrivalCallback arrival() {
    std::lock_guard<std::mutex> lock(mu_);
    return arrival_;
  }
  void SetLanding(LandingCallback cb) {
    std::lock_guard<std::mutex> lock(mu_);
    landing_ = std::move(cb);
  }
  LandingCallback landing() {
    std::lock_guard<std::mutex> lock(mu_);
    return landing_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  RegionTable regions_;
  StepFence fence_{"local"};
  std::unique_ptr<DeviceCopies> device_copies_ = CudaDeviceCopies();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  ArrivalCallback arrival_;
  LandingCallback landing_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after the rest is built
};

namespace {

class LocalPeer : public Peer {
 public:
  LocalPeer(std::string our_name, std::string peer_name, std::shared_ptr<LocalEngine> engine)
      : our_name_(std::move(our_name)),
        peer_name_(std::move(peer_name)),
        engine_(std::move(engine)) {}

  const std::string& name() const override { return peer_name_; }

  absl::Status AddRemoteRegion(const weightbeam::v1::RegionDescriptor& region) override {
    for (const auto& key : region.keys()) {
      if (key.transport() != "local") continue;
      std::lock_guard<std::mutex> lock(mu_);
      remote_[region.region_id()] = Remote{key.key(), region.length()};
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat("local peer '", peer_name_, "': region ",
                                                   region.region_id(), " has no local key"));
  }

  void RemoveRemoteRegion(uint64_t region_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    remote_.erase(region_id);
  }

  void PostBatch(std::vector<WriteOp> ops, BatchDone done) override {
    std::vector<std::pair<WriteOp, uint64_t>> checked;  // op, remote key
    absl::Status status = Check(ops, &checked);
    // A raw engine pointer: the engine drains its queue before it is destroyed, and a task
    // holding the last reference would make the worker thread join itself.
    engine_->Post([this_name = our_name_, peer = peer_name_, engine = engine_.get(), status,
                   checked = std::move(checked), done = std::move(done)]() mutable {
      if (!status.ok()) {
        done(status);
        return;
      }
      // Pin every range first: a refused write must leave every destination untouched. The
      // step fence comes first: a write of a step this agent does not accept never lands, and
      // the fence cannot move on while the copies below run.
      std::vector<StepFence::Pass> passes(checked.size());
      std::vector<std::pair<RegionTable::Pin, RegionTable::Pin>> pins;
      pins.reserve(checked.size());
      uint64_t bytes = 0;
      for (size_t i = 0; i < checked.size(); ++i) {
        const WriteOp& op = checked[i].first;
        if (auto admitted = engine->fence().Admit(op.step, this_name, &passes[i]); !admitted.ok()) {
          passes.clear();
          pins.clear();
          done(absl::Status(admitted.code(), absl::StrCat("local peer '", peer, "': write ", i,
                                                          ": ", admitted.message())));
          return;
        }
        auto src = engine->regions().PinLocal(op.local_region, op.local_offset, op.length);
        auto dst = engine->regions().PinRemoteWrite(op.remote_region, checked[i].second,
                                                    op.remote_offset, op.length);
        if (!src.ok() || !dst.ok()) {
          const absl::Status& bad = !src.ok() ? src.status() : dst.status();
          done(absl::Status(bad.code(), absl::StrCat("local peer '", peer, "': write ", i,
                                                     " refused: ", bad.message())));
          return;
        }
        pins.emplace_back(std::move(*src), std::move(*dst));
        bytes += op.length;
      }
      // Host memory only under the SIGBUS guard (an owner may shrink its shm object), CUDA only
      // outside it (guarded_copy.h).
      for (size_t i = 0; i < checked.size(); ++i) {
        const RegionTable::Pin& src = pins[i].first;
        const RegionTable::Pin& dst = pins[i].second;
        if (auto st = CopyGuarded({dst.data(), dst.kind(), dst.device()},
                                  {src.data(), src.kind(), src.device()}, checked[i].first.length,
                                  engine->device_copies());
            !st.ok()) {
          pins.clear();
          passes.clear();
          done(absl::Status(
              st.code(), absl::StrCat("local peer '", peer, "': write ", i, ": ", st.message())));
          return;
        }
      }
      if (auto landing = engine->landing()) {
        for (size_t i = 0; i < checked.size(); ++i) {
          landing(checked[i].first.step, pins[i].second.data(), checked[i].first.length);
        }
      }
      pins.clear();
      passes.clear();
      done(absl::OkStatus());
      if (auto arrival = engine->arrival()) arrival(this_name, bytes);
    });
  }

 private:
  struct Remote {
    uint64_t key = 0;
    uint64_t length = 0;
  };

  absl::Status Check(const std::vector<WriteOp>& ops,
                     std::vector<std::pair<WriteOp, uint64_t>>* checked) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < ops.size(); ++i) {
      const WriteOp& op = ops[i];  // empty ops stay in, so that indices match the caller's
      auto it = remote_.find(op.remote_region);
      if (it == remote_.end()) {
        return absl::NotFoundError(absl::StrCat("local peer '", peer_name_, "': write ", i,
                                                ": remote region ", op.remote_region,
                                                " is unknown (AddRemoteRegion first)"));
      }
      if (op.remote_offset > it->second.length ||
          op.length > it->second.length - op.remote_offset) {
        return absl::OutOfRangeError(absl::StrCat("local peer '", peer_name_, "': write ", i,
                                                  ": remote [", op.remote_offset, ", +", op.length,
                                                  ") is out of bounds of region ", op.remote_region,
                                                  " (length ", it->second.length, ")"));
      }
      checked->emplace_back(op, it->second.key);
    }
    return absl::OkStatus();
  }

  const std::string our_name_;
  const std::string peer_name_;
  const std::shared_ptr<LocalEngine> engine_;
  std::mutex mu_;
  std::map<uint64_t, Remote> remote_;
};

}  // namespace

LocalTransport::LocalTransport()
    : engine_(std::make_shared<LocalEngine>()),
      instance_(absl::StrCat("local:", getpid(), ":", RandomU64())) {}

LocalTransport::~LocalTransport() = default;

Capabilities LocalTransport::caps() const {
  Capabilities caps;
  caps.gpu_memory = SoftwareGpuMemorySupported();
  caps.windows = true;
  caps.reports_landing = true;
  caps.remote = false;
  return caps;
}

std::vector<weightbeam::v1::NicInfo> LocalTransport::Nics() const {
  weightbeam::v1::NicInfo nic;
  nic.set_name("local");
  nic.set_transport("local");
  nic.set_gbps(20.0);
  return {nic};
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> LocalTransport::Add(const MemoryRef& mem,
                                                                     Access access, bool windowed) {
  if (mem.kind == MemoryKind::kCuda) {
    if (absl::Status s = CheckGpuMemory("local", mem); !s.ok()) return s;
  }
  auto info = engine_->regions().Add(mem, access, windowed);
  if (!info.ok()) return info.status();
  weightbeam::v1::RegionDescriptor desc;
  desc.set_region_id(info->id);
  desc.set_length(info->length);
  auto* key = desc.add_keys();
  key->set_transport("local");
  key->set_device("local");
  key->set_key(access == Access::kDestination ? info->key : 0);
  return desc;
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> LocalTransport::Register(const MemoryRef& mem,
                                                                          Access access) {
  return Add(mem, access, /*windowed=*/false);
}

absl::StatusOr<weightbeam::v1::RegionDescriptor> LocalTransport::RegisterBuffer(
    const MemoryRef& mem, Access access) {
  return Add(mem, access, /*windowed=*/true);
}

absl::Status LocalTransport::OpenWindow(uint64_t region_id, uint64_t offset, uint64_t length) {
  return engine_->regions().OpenWindow(region_id, offset, length);
}

absl::Status LocalTransport::CloseWindow(uint64_t region_id, uint64_t offset, uint64_t length) {
  return engine_->regions().CloseWindow(region_id, offset, length);
}

absl::Status LocalTransport::Deregister(uint64_t region_id) {
  return engine_->regions().Remove(region_id);
}

absl::StatusOr<std::shared_ptr<Peer>> LocalTransport::Connect(const std::string& our_name,
                                                              const std::string& peer_name,
                                                              const HandshakeExchange& exchange) {
  auto reply = exchange(instance_);
  if (!reply.ok()) {
    return absl::Status(reply.status().code(),
                        absl::StrCat("local peer '", peer_name,
                                     "': handshake exchange failed: ", reply.status().message()));
  }
  if (*reply != instance_) {
    return absl::FailedPreconditionError(
        absl::StrCat("local transport: peer '", peer_name,
                     "' is another process or agent; the local transport only connects to itself"));
  }
  return std::shared_ptr<Peer>(std::make_shared<LocalPeer>(our_name, peer_name, engine_));
}

absl::StatusOr<std::string> LocalTransport::Accept(const std::string& peer_name,
                                                   const std::string& their_record) {
  if (their_record != instance_) {
    return absl::FailedPreconditionError(
        absl::StrCat("local transport: peer '", peer_name,
                     "' is another process or agent; the local transport only connects to itself"));
  }
  return instance_;
}

void LocalTransport::SetArrivalCallback(ArrivalCallback cb) { engine_->SetArrival(std::move(cb)); }
void LocalTransport::SetLandingCallback(LandingCallback cb) { engine_->SetLanding(std::move(cb)); }

// Copies run on the engine's thread and finish on their own: nothing to cut, only to wait for.
absl::Status LocalTransport::OpenStep(uint64_t step) { return engine_->fence().Open(step, {}); }

absl::Status LocalTransport::CloseStep(bool) { return engine_->fence().Close({}); }

uint64_t LocalTransport::RefusedWrites(uint64_t step) const {
  return engine_->fence().Refused(step);
}

void LocalTransport::SetFenceCallback(FenceCallback cb) {
  engine_->fence().SetCallback(std::move(cb));
}

absl::StatusOr<std::unique_ptr<Transport>> MakeLocalTransport(
    const wb::config::AgentConfig& config) {
  return std::unique_ptr<Transport>(std::make_unique<LocalTransport>());
}

}  // namespace wb::transport::local
