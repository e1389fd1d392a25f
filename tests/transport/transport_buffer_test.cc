// Tensors registered as parts of one buffer (the registry registers the buffer once with
// transports that have windows: tcp, local, rdma): the number of transport registrations does
// not grow with the tensor count, and a withdrawn tensor's bytes are refused while its buffer
// stays registered for the others. Runs against every backend of the suite; rdma (caps().rekeys)
// refuses by registering the buffer afresh on a withdrawal: the old rkey fails at the NIC and the
// buffer's other tensors take writes under the new one, read from the registry's layout.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/registry/region_registry.h"
#include "tests/transport/suite_util.h"

namespace wb::transport::testing {
namespace {

namespace v1 = weightbeam::v1;
constexpr std::chrono::milliseconds kWait{20000};
constexpr uint64_t kTensorBytes = 512;

// One receiving agent's registry over the pair's receiver, whose tensors all live in `memory`
// (as a shared-memory object's one mapping would hold them).
struct BufferedReceiver {
  explicit BufferedReceiver(Pair* pair, size_t bytes)
      : memory(Pattern(bytes, 7)),
        registry({pair->receiver}, [this](const v1::MemoryHandle& h, const registry::Caller&) {
          registry::OpenedMemory m;
          m.ref = {memory.data() + h.host_shm().offset(), h.host_shm().length()};
          m.buffer = {memory.data(), memory.size()};
          m.location = "host";
          m.hold = std::make_shared<registry::MemoryHold>();
          return absl::StatusOr<registry::OpenedMemory>(m);
        }) {}

  // Tensor `name`: kTensorBytes of the buffer at `offset`, an inference destination.
  absl::StatusOr<v1::TensorLayout> Add(uint64_t session, const std::string& name, uint64_t offset) {
    v1::TensorRegistration r;
    r.mutable_spec()->set_name(name);
    r.mutable_spec()->set_dtype(v1::DTYPE_BF16);
    r.mutable_spec()->add_global_shape(kTensorBytes / 2);
    r.mutable_memory()->mutable_host_shm()->set_shm_name("/weights");
    r.mutable_memory()->mutable_host_shm()->set_offset(offset);
    r.mutable_memory()->mutable_host_shm()->set_length(kTensorBytes);
    v1::Owner owner;
    owner.set_role(v1::ROLE_INFERENCE);
    return registry.Register(session, owner, r);
  }

  uint64_t Regions() const {
    for (const auto& s : registry.RegistrationStats()) return s.regions;
    return 0;
  }
  // Registrations made since start, re-registrations included.
  uint64_t Registered() const {
    for (const auto& s : registry.RegistrationStats()) return s.registered;
    return 0;
  }
  // Tensor `name`'s layout as the registry reports it now (its buffer's current keys).
  v1::TensorLayout Current(const std::string& name) const {
    const v1::AgentLayout layout = registry.Layout("receiver");
    for (const auto& t : layout.tensors()) {
      if (t.spec().name() == name) return t;
    }
    FAIL("tensor " << name << " is not in the layout");
    return {};
  }

  std::vector<uint8_t> memory;
  registry::RegionRegistry registry;
};

// The sender's view of one remote tensor, as the peer connector builds it: the transport region
// (added to the peer) and where the tensor starts in it.
struct Target {
  uint64_t region = 0, base = 0;
};
Target Introduce(Peer* peer, const v1::TensorLayout& layout, const std::string& transport) {
  v1::RegionDescriptor own;
  Target t;
  for (const auto& key : layout.region().keys()) {
    if (key.transport() != transport) continue;
    own.set_region_id(key.transport_region());
    own.set_length(key.region_length() ? key.region_length() : layout.region().length());
    *own.add_keys() = key;
    t = {key.transport_region(), key.base()};
  }
  REQUIRE(peer->AddRemoteRegion(own).ok());
  return t;
}

TEST_CASE("transport registrations do not grow with the tensor count of a buffer",
          "[transport][buffer]") {
  auto pair = MakePair();
  constexpr int kTensors = 1000;
  BufferedReceiver receiver(pair.get(), kTensors * kTensorBytes);
  for (int i = 0; i < kTensors; ++i) {
    auto added = receiver.Add(1, "layer." + std::to_string(i) + ".w", i * kTensorBytes);
    INFO(added.status().ToString());
    REQUIRE(added.ok());
  }
  const bool windows = pair->receiver->caps().windows;
  const bool rekeys = windows && pair->receiver->caps().rekeys;
  CHECK(receiver.Regions() == (windows ? 1u : uint64_t{kTensors}));
  CHECK(receiver.Registered() == (windows ? 1u : uint64_t{kTensors}));
  // One tensor withdrawn while the others stay: rdma registers the buffer afresh, once.
  REQUIRE(receiver.registry.Unregister(1, "layer.7.w").ok());
  CHECK(receiver.Regions() == (windows ? 1u : uint64_t{kTensors - 1}));
  CHECK(receiver.Registered() == (rekeys ? 2u : windows ? 1u : uint64_t{kTensors}));
  // The session's end closes the other windows at once and deregisters the buffer: no further
  // registration, however many tensors it held.
  CHECK(receiver.registry.WithdrawSession(1) == kTensors - 1);
  CHECK(receiver.Regions() == 0);
  CHECK(receiver.Registered() == (rekeys ? 2u : windows ? 1u : uint64_t{kTensors}));
}

TEST_CASE("a withdrawn tensor inside a still-registered buffer cannot be written",
          "[transport][buffer]") {
  auto pair = MakePair();
  const std::string name = pair->receiver->Name();
  BufferedReceiver receiver(pair.get(), 4 * kTensorBytes);
  auto a = receiver.Add(1, "a", 0);
  auto b = receiver.Add(2, "b", kTensorBytes);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto src = RegisterBuffer(pair->sender, kTensorBytes, Access::kSource, 30);
  const Target to_a = Introduce(pair->peer.get(), *a, name);
  const Target to_b = Introduce(pair->peer.get(), *b, name);
  if (pair->receiver->caps().windows) {
    CHECK(to_a.region == to_b.region);  // one registration, two windows
    CHECK(to_b.base == kTensorBytes);
  }
  auto write = [&](const Target& to) {
    return pair->peer->WriteBatch(
        {WriteOp{src->desc.region_id(), 0, to.region, to.base, kTensorBytes}}, kWait);
  };
  REQUIRE(write(to_a).ok());
  CHECK(std::memcmp(receiver.memory.data(), src->bytes.data(), kTensorBytes) == 0);

  // a's owner withdraws it; b keeps the buffer registered.
  REQUIRE(receiver.registry.Unregister(1, "a").ok());
  if (pair->receiver->caps().windows) CHECK(receiver.Regions() == 1);
  std::vector<uint8_t> later = Pattern(kTensorBytes, 31);
  std::memcpy(src->bytes.data(), later.data(), later.size());
  const std::vector<uint8_t> before = receiver.memory;
  absl::Status refused = write(to_a);
  INFO(refused.ToString());
  CHECK_FALSE(refused.ok());
  CHECK(receiver.memory == before);  // not a byte of the withdrawn tensor changed
  const bool rekeys = pair->receiver->caps().rekeys;
  if (rekeys) {
    // The NIC refused the old rkey (the buffer was registered afresh): a's write and b's under
    // the old key alike. b's layout now carries the new key, as a re-fetched layout would.
    CHECK_THAT(std::string(refused.message()), Catch::Contains("remote access error"));
    absl::Status stale = write(to_b);
    INFO(stale.ToString());
    CHECK_FALSE(stale.ok());
    CHECK(receiver.memory == before);
    const Target fresh_b = Introduce(pair->peer.get(), receiver.Current("b"), name);
    CHECK(fresh_b.region == to_b.region);
    CHECK(fresh_b.base == to_b.base);
  }
  // The buffer's other tensor still takes writes (tcp, local: under the same key; rdma: under
  // the buffer's new one).
  absl::Status landed = write(to_b);
  INFO(landed.ToString());
  REQUIRE(landed.ok());
  CHECK(std::memcmp(receiver.memory.data() + kTensorBytes, later.data(), kTensorBytes) == 0);
  CHECK(std::memcmp(receiver.memory.data(), before.data(), kTensorBytes) == 0);
  if (!rekeys) {
    // Writes into bytes of the buffer no tensor was ever registered in are refused too.
    CHECK_FALSE(write(Target{to_b.region, to_b.base + kTensorBytes}).ok());
  }
  // rdma: the buffer's memory region covers all of it, so under the live key the NIC admits a
  // write anywhere in the buffer, a withdrawn tensor's bytes included, until the next
  // re-registration; the key is only ever given out in the layouts of its live tensors, and the
  // sender bounds every write by its tensor (docs/security.md "One registration per buffer").
}

}  // namespace
}  // namespace wb::transport::testing
