// A transport that cannot register one region (GPU memory rdma cannot pin: no dma-buf, no
// nvidia-peermem) declines it; the registry then registers the tensor with the other transports
// instead of failing it everywhere, and a route that needs the declining transport says so.
// Any other registration error still fails the whole tensor, leaving nothing behind.
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/registry/region_registry.h"
#include "daemon/transport/transport.h"

namespace v1 = weightbeam::v1;
using namespace wb;

namespace {

// Registers host memory; GPU memory it declines (`decline`), fails (`fail`) or takes.
class FakeTransport : public transport::Transport {
 public:
  enum class Gpu { kTake, kDecline, kFail };
  FakeTransport(std::string name, Gpu gpu) : name_(std::move(name)), gpu_(gpu) {}

  std::string Name() const override { return name_; }
  transport::Capabilities caps() const override { return {}; }
  std::vector<v1::NicInfo> Nics() const override { return {}; }
  absl::StatusOr<v1::RegionDescriptor> Register(const transport::MemoryRef& mem,
                                                transport::Access) override {
    if (mem.kind == transport::MemoryKind::kCuda && gpu_ == Gpu::kDecline) {
      return transport::DeclineRegion(name_ + ": cannot pin GPU memory (no dma-buf)");
    }
    if (mem.kind == transport::MemoryKind::kCuda && gpu_ == Gpu::kFail) {
      return absl::InternalError(name_ + ": broken");
    }
    v1::RegionDescriptor d;
    d.set_region_id(next_++);
    d.set_length(mem.length);
    auto* key = d.add_keys();
    key->set_transport(name_);
    key->set_key(d.region_id());
    live.insert(d.region_id());
    return d;
  }
  absl::Status Deregister(uint64_t region_id) override {
    live.erase(region_id);
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<transport::Peer>> Connect(
      const std::string&, const std::string&, const transport::HandshakeExchange&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::string> Accept(const std::string&, const std::string&) override {
    return absl::UnimplementedError("fake");
  }
  void ForgetPeer(const std::string&, transport::PeerSide) override {}
  void SetArrivalCallback(transport::ArrivalCallback) override {}
  absl::Status OpenStep(uint64_t) override { return absl::OkStatus(); }
  absl::Status CloseStep(bool) override { return absl::OkStatus(); }
  uint64_t RefusedWrites(uint64_t) const override { return 0; }
  void SetFenceCallback(transport::FenceCallback) override {}

  std::set<uint64_t> live;

 private:
  std::string name_;
  Gpu gpu_;
  uint64_t next_ = 100;
};

uint8_t g_memory[4096];

// Opens every handle as memory of the kind the handle names (no CUDA involved).
registry::OpenedMemory Open(const v1::MemoryHandle& h) {
  registry::OpenedMemory m;
  const bool gpu = h.has_cuda_ipc();
  m.ref = {g_memory, gpu ? h.cuda_ipc().length() : h.host_shm().length(),
           gpu ? transport::MemoryKind::kCuda : transport::MemoryKind::kHost, gpu ? 0 : -1};
  m.location = gpu ? "cuda:0" : "host";
  m.hold = std::make_shared<registry::MemoryHold>();
  return m;
}

v1::TensorRegistration Reg(const std::string& name, bool gpu) {
  v1::TensorRegistration r;
  r.mutable_spec()->set_name(name);
  r.mutable_spec()->set_dtype(v1::DTYPE_BF16);
  r.mutable_spec()->add_global_shape(16);
  r.mutable_spec()->add_global_shape(64);
  if (gpu) {
    auto* ipc = r.mutable_memory()->mutable_cuda_ipc();
    ipc->set_ipc_handle(std::string(64, 'h'));
    ipc->set_length(2048);
  } else {
    r.mutable_memory()->mutable_host_shm()->set_shm_name("/" + name);
    r.mutable_memory()->mutable_host_shm()->set_length(2048);
  }
  return r;
}

v1::Owner Trainer() {
  v1::Owner o;
  o.set_role(v1::ROLE_TRAINER);
  return o;
}

std::set<std::string> KeyTransports(const v1::RegionDescriptor& d) {
  std::set<std::string> names;
  for (const auto& k : d.keys()) names.insert(k.transport());
  return names;
}

TEST_CASE("a region one transport declines is registered with the others") {
  FakeTransport rdma("rdma", FakeTransport::Gpu::kDecline);
  FakeTransport tcp("tcp", FakeTransport::Gpu::kTake);
  FakeTransport local("local", FakeTransport::Gpu::kTake);
  registry::RegionRegistry registry({&rdma, &tcp, &local},
                                    [](const v1::MemoryHandle& h, const registry::Caller&) {
                                      return absl::StatusOr<registry::OpenedMemory>(Open(h));
                                    });
  auto gpu = registry.Register(1, Trainer(), Reg("gpu.w", true));
  REQUIRE(gpu.ok());
  CHECK(KeyTransports(gpu->region()) == std::set<std::string>{"tcp", "local"});
  auto t = registry.Find(gpu->region().region_id());
  REQUIRE(t);
  CHECK(t->transport_regions.count("rdma") == 0);
  CHECK(t->transport_regions.count("tcp") == 1);
  REQUIRE(t->declined.count("rdma") == 1);
  CHECK(t->declined.at("rdma").find("no dma-buf") != std::string::npos);
  CHECK(rdma.live.empty());
  // Host memory still goes to every transport.
  auto host = registry.Register(1, Trainer(), Reg("host.w", false));
  REQUIRE(host.ok());
  CHECK(KeyTransports(host->region()) == std::set<std::string>{"rdma", "tcp", "local"});
}

TEST_CASE("a region every transport declines fails, with each transport's reason") {
  FakeTransport rdma("rdma", FakeTransport::Gpu::kDecline);
  FakeTransport other("rdma2", FakeTransport::Gpu::kDecline);
  registry::RegionRegistry registry({&rdma, &other},
                                    [](const v1::MemoryHandle& h, const registry::Caller&) {
                                      return absl::StatusOr<registry::OpenedMemory>(Open(h));
                                    });
  auto r = registry.Register(1, Trainer(), Reg("gpu.w", true));
  REQUIRE_FALSE(r.ok());
  const std::string msg(r.status().message());
  CHECK(msg.find("tensor 'gpu.w'") != std::string::npos);
  CHECK(msg.find("rdma: cannot pin") != std::string::npos);
  CHECK(msg.find("rdma2: cannot pin") != std::string::npos);
  CHECK(registry.size() == 0);
}

TEST_CASE("any other registration failure still fails the tensor and leaves nothing behind") {
  FakeTransport tcp("tcp", FakeTransport::Gpu::kTake);
  FakeTransport broken("rdma", FakeTransport::Gpu::kFail);
  registry::RegionRegistry registry({&tcp, &broken},
                                    [](const v1::MemoryHandle& h, const registry::Caller&) {
                                      return absl::StatusOr<registry::OpenedMemory>(Open(h));
                                    });
  auto r = registry.Register(1, Trainer(), Reg("gpu.w", true));
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("registering with rdma failed") !=
        std::string::npos);
  CHECK(tcp.live.empty());  // the tcp registration was undone
  CHECK(registry.size() == 0);
}

TEST_CASE("a declined status is told apart from other errors") {
  const absl::Status declined = transport::DeclineRegion("no dma-buf");
  CHECK(transport::IsDeclined(declined));
  CHECK(declined.message() == "no dma-buf");
  CHECK_FALSE(transport::IsDeclined(absl::UnavailableError("no dma-buf")));
  CHECK_FALSE(transport::IsDeclined(absl::OkStatus()));
}

}  // namespace
