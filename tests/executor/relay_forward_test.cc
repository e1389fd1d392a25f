// Pipelined relay forwarding (issue 30, the agent's half): three agents in one process, each
// with its own registry, transports and executor, talking over real tcp on loopback. A sender
// writes a tensor into the relay's destination; the relay's executor holds relay ops (its own
// destination bytes -> the child's same tensor) until the landing tracker has seen every byte
// of each, and forwards each as soon as it is in, while the sender is still sending. Every
// byte of the child is compared with the sender's source.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "config/config.h"
#include "daemon/executor/executor.h"
#include "daemon/executor/landing_tracker.h"
#include "daemon/executor/op_preparer.h"
#include "daemon/registry/region_registry.h"
#include "daemon/transport/factory.h"

namespace v1 = weightbeam::v1;
using namespace wb;
using Clock = std::chrono::steady_clock;

namespace {

class HeapHold : public registry::MemoryHold {
 public:
  explicit HeapHold(size_t n) : bytes(n) {}
  std::vector<uint8_t> bytes;
};

constexpr int64_t kRows = 512, kCols = 1024;     // BF16: 1 MiB
constexpr uint64_t kRowBytes = kCols * 2;        // 2 KiB
constexpr uint64_t kRunBytes = 128 * kRowBytes;  // a relay op: 256 KiB
constexpr uint64_t kTensorBytes = kRows * kRowBytes;

// One agent: its memory, tcp + local transports, registry and executor.
struct Agent {
  std::string name;
  std::map<std::string, std::shared_ptr<HeapHold>> buffers;
  std::vector<std::unique_ptr<transport::Transport>> owned;
  transport::Transport* tcp = nullptr;
  std::unique_ptr<registry::RegionRegistry> registry;
  std::unique_ptr<executor::StagingPool> staging;
  executor::OpPreparer preparer;
  std::unique_ptr<executor::Executor> exec;
  executor::LandingTracker landing;

  Agent(std::string agent_name, executor::ExecutorOptions options = {})
      : name(std::move(agent_name)) {
    config::AgentConfig cfg;
    cfg.tcp.listen = "127.0.0.1:0";
    for (const std::string t : {"local", "tcp"}) {
      auto made = transport::MakeTransport(t, cfg);
      REQUIRE(made.ok());
      if (t == "tcp") tcp = made->get();
      owned.push_back(std::move(*made));
    }
    std::vector<transport::Transport*> raw;
    for (auto& t : owned) raw.push_back(t.get());
    registry = std::make_unique<registry::RegionRegistry>(
        raw,
        [this](const v1::MemoryHandle& h,
               const registry::Caller&) -> absl::StatusOr<registry::OpenedMemory> {
          auto& b = buffers[h.host_shm().shm_name()];
          if (!b) b = std::make_shared<HeapHold>(h.host_shm().length());
          registry::OpenedMemory m;
          m.ref = {b->bytes.data(), b->bytes.size(), transport::MemoryKind::kHost, -1};
          m.location = "host";
          m.hold = b;
          return m;
        });
    staging = std::make_unique<executor::StagingPool>(uint64_t{8} << 20, raw);
    exec = std::make_unique<executor::Executor>(registry.get(), staging.get(), &preparer, options);
    exec->SetLandingTracker(&landing);
    for (auto& t : owned) {
      t->SetLandingCallback([this](uint64_t step, const void* addr, uint64_t length) {
        landing.Landed(step, addr, length);
      });
    }
  }

  v1::TensorLayout Register(v1::Role role) {
    v1::TensorRegistration r;
    r.mutable_spec()->set_name("w");
    r.mutable_spec()->set_dtype(v1::DTYPE_BF16);
    r.mutable_spec()->add_global_shape(kRows);
    r.mutable_spec()->add_global_shape(kCols);
    r.mutable_memory()->mutable_host_shm()->set_shm_name("/" + name + "-w");
    r.mutable_memory()->mutable_host_shm()->set_length(kTensorBytes);
    v1::Owner o;
    o.set_role(role);
    auto l = registry->Register(role == v1::ROLE_TRAINER ? 1 : 2, o, r);
    REQUIRE(l.ok());
    return *l;
  }
  std::vector<uint8_t>& Bytes() { return buffers["/" + name + "-w"]->bytes; }
};

// `from`'s route to `to` over tcp for `to`'s destination `region` (what PeerConnector builds).
executor::Route Connect(Agent& from, Agent& to, const v1::TensorLayout& region) {
  auto* theirs = to.tcp;
  auto peer = from.tcp->Connect(
      from.name, to.name, [&](const std::string& ours) { return theirs->Accept(from.name, ours); });
  REQUIRE(peer.ok());
  executor::Route route;
  route.peer = *peer;
  route.transport = from.tcp;
  for (const auto& key : region.region().keys()) {
    if (key.transport() != "tcp") continue;
    v1::RegionDescriptor own;
    own.set_region_id(key.transport_region());
    own.set_length(key.region_length() ? key.region_length() : region.region().length());
    *own.add_keys() = key;
    REQUIRE((*peer)->AddRemoteRegion(own).ok());
    route.remote_regions[region.region().region_id()] = {key.transport_region(), key.base(),
                                                         region.region().length()};
  }
  REQUIRE(route.remote_regions.size() == 1);
  return route;
}

// A copy of `rows` rows of `row_bytes` (element size `elem`) at byte `offset` of w, from
// `src` to `dst` on agent `to`, the same offset on both sides.
v1::TransferOp Copy(uint64_t id, const std::string& to, const v1::TensorLayout& src,
                    const v1::TensorLayout& dst, uint64_t offset, uint64_t rows, uint64_t row_bytes,
                    v1::DType dtype, uint64_t elem) {
  v1::TransferOp op;
  op.set_op_id(id);
  op.set_dst_agent(to);
  op.set_src_tensor("w");
  op.set_dst_tensor("w");
  op.set_src_region(src.region().region_id());
  op.set_dst_region(dst.region().region_id());
  op.set_src_offset(offset);
  op.set_dst_offset(offset);
  op.set_rows(rows);
  op.set_row_elems(row_bytes / elem);
  op.set_src_stride(row_bytes);
  op.set_dst_stride(row_bytes);
  op.set_src_dtype(dtype);
  op.set_dst_dtype(dtype);
  op.set_transform(v1::TRANSFORM_COPY);
  return op;
}

// The sender's ops: 8 blocks of 64 rows, last block first (landing order is not run order).
std::vector<v1::TransferOp> SenderOps(const v1::TensorLayout& src, const v1::TensorLayout& dst,
                                      const std::string& relay) {
  std::vector<v1::TransferOp> ops;
  for (int64_t b = 7; b >= 0; --b) {
    ops.push_back(
        Copy(ops.size(), relay, src, dst, b * 64 * kRowBytes, 64, kRowBytes, v1::DTYPE_BF16, 2));
  }
  return ops;
}

// The relay's ops, as planner::RelayOps makes them: runs of bytes of its own destination.
std::vector<v1::TransferOp> RelayOps(const v1::TensorLayout& own, const v1::TensorLayout& child,
                                     const std::string& child_agent) {
  std::vector<v1::TransferOp> ops;
  for (uint64_t at = 0; at < kTensorBytes; at += kRunBytes) {
    ops.push_back(Copy(ops.size(), child_agent, own, child, at, 1, kRunBytes, v1::DTYPE_U8, 1));
    ops.back().set_relay(true);
  }
  return ops;
}

void FillRandom(std::vector<uint8_t>& b) {
  std::mt19937 rng(11);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
}

}  // namespace

TEST_CASE("a relay forwards each run as soon as it has landed, every byte reaching the child") {
  executor::ExecutorOptions slow;
  // The sender holds each op 250 ms: its step takes ~2 s, and the run its first two ops land
  // is forwarded ~1.5 s before it ends, a margin that survives a loaded machine.
  slow.test_hold_version = 1;
  slow.test_hold = std::chrono::milliseconds(250);
  Agent sender("sender", slow), relay("relay"), child("child");
  const v1::TensorLayout src = sender.Register(v1::ROLE_TRAINER);
  const v1::TensorLayout mid = relay.Register(v1::ROLE_INFERENCE);
  const v1::TensorLayout dst = child.Register(v1::ROLE_INFERENCE);
  FillRandom(sender.Bytes());

  sender.exec->Load(SenderOps(src, mid, "relay"), {{"relay", Connect(sender, relay, mid)}});
  relay.exec->Load(RelayOps(mid, dst, "child"), {{"child", Connect(relay, child, dst)}});
  const uint64_t step = 0x5eed;
  relay.landing.Open(step);

  // The relay's step starts first and waits: nothing has landed in it yet.
  v1::AgentStepReport relay_report;
  std::thread relay_thread(
      [&] { relay_report = relay.exec->Execute(1, std::chrono::seconds(20), {}, {}, step); });
  // When the child holds the last run (the sender's first op) complete: before the sender's
  // step is over, if the relay pipelines.
  const std::vector<uint8_t> want(sender.Bytes());
  std::atomic<bool> sender_done{false};
  std::atomic<bool> first_run_early{false};
  std::thread watch([&] {
    const uint64_t last = kTensorBytes - kRunBytes;
    while (!sender_done) {
      if (std::memcmp(child.Bytes().data() + last, want.data() + last, kRunBytes) == 0) {
        first_run_early = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  CHECK(std::all_of(child.Bytes().begin(), child.Bytes().end(), [](uint8_t b) { return b == 0; }));

  const auto t0 = Clock::now();
  v1::AgentStepReport sent = sender.exec->Execute(1, std::chrono::seconds(20), {}, {}, step);
  sender_done = true;
  const double send_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  watch.join();
  relay_thread.join();
  INFO(sent.error() << " / " << relay_report.error());
  REQUIRE(sent.ok());
  REQUIRE(relay_report.ok());
  CHECK(send_seconds > 1.6);  // the holds really spread the sender's step out
  CHECK(relay_report.ops() == kTensorBytes / kRunBytes);
  // What the controller measures the relay's link by: every byte forwarded, and the time its
  // writes were on the wire, far below the step it spent mostly waiting for bytes.
  CHECK(relay_report.bytes_forwarded() == kTensorBytes);
  CHECK(relay_report.forward_seconds() > 0);
  CHECK(relay_report.forward_seconds() < 0.5 * send_seconds);
  CHECK(first_run_early);  // forwarded while the sender was still sending
  CHECK(relay.Bytes() == want);
  CHECK(child.Bytes() == want);
}

TEST_CASE("relay ops wait for their own step's bytes: another step's landings do not count") {
  Agent sender("sender"), relay("relay"), child("child");
  const v1::TensorLayout src = sender.Register(v1::ROLE_TRAINER);
  const v1::TensorLayout mid = relay.Register(v1::ROLE_INFERENCE);
  const v1::TensorLayout dst = child.Register(v1::ROLE_INFERENCE);
  FillRandom(sender.Bytes());
  sender.exec->Load(SenderOps(src, mid, "relay"), {{"relay", Connect(sender, relay, mid)}});
  relay.exec->Load(RelayOps(mid, dst, "child"), {{"child", Connect(relay, child, dst)}});

  relay.landing.Open(8);
  // Step 7's writes land (the relay's transports have no fence armed here) but are not step 8's.
  v1::AgentStepReport sent = sender.exec->Execute(1, std::chrono::seconds(20), {}, {}, 7);
  REQUIRE(sent.ok());
  CHECK(relay.Bytes() == sender.Bytes());
  const auto t0 = Clock::now();
  v1::AgentStepReport relayed = relay.exec->Execute(1, std::chrono::milliseconds(600), {}, {}, 8);
  CHECK_FALSE(relayed.ok());
  CHECK_THAT(relayed.error(), Catch::Contains("had not all landed"));
  CHECK(Clock::now() - t0 < std::chrono::seconds(5));
  CHECK(std::all_of(child.Bytes().begin(), child.Bytes().end(), [](uint8_t b) { return b == 0; }));

  // The same step's bytes, once they land, are forwarded.
  relay.landing.Open(9);
  std::thread relay_thread(
      [&] { relayed = relay.exec->Execute(2, std::chrono::seconds(20), {}, {}, 9); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  sent = sender.exec->Execute(2, std::chrono::seconds(20), {}, {}, 9);
  relay_thread.join();
  INFO(relayed.error());
  REQUIRE(sent.ok());
  REQUIRE(relayed.ok());
  CHECK(child.Bytes() == sender.Bytes());
}

TEST_CASE("the landing tracker merges ranges and answers coverage per step") {
  executor::LandingTracker t;
  std::vector<uint8_t> mem(1000);
  const uint8_t* p = mem.data();
  t.Landed(1, p, 100);  // before Open: ignored
  CHECK_FALSE(t.Covered(1, p, 10));
  t.Open(1);
  t.Landed(1, p + 200, 100);
  t.Landed(1, p, 100);
  CHECK(t.Covered(1, p, 100));
  CHECK_FALSE(t.Covered(1, p, 101));  // a gap at [100, 200)
  CHECK_FALSE(t.Covered(1, p + 50, 200));
  t.Landed(1, p + 100, 100);  // fills the gap: one range [0, 300)
  CHECK(t.Covered(1, p, 300));
  CHECK_FALSE(t.Covered(1, p, 301));
  CHECK_FALSE(t.Covered(2, p, 10));  // another step
  t.Landed(2, p + 300, 100);         // another step's landing: ignored
  CHECK_FALSE(t.Covered(1, p + 300, 1));
  const uint64_t seen = t.changes();
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t.Landed(1, p + 500, 10);
  });
  CHECK(t.WaitChange(seen, Clock::now() + std::chrono::seconds(5)) != seen);
  later.join();
  CHECK(t.Covered(1, p + 500, 10));
  t.Open(3);  // a new step forgets everything
  CHECK_FALSE(t.Covered(3, p, 1));
  t.LandAll(2);  // not the open step: nothing changes
  CHECK_FALSE(t.Covered(3, p, 1));
  t.LandAll(3);  // delta mode, after the apply: every byte of the step is final
  CHECK(t.Covered(3, p + 700, 300));
  CHECK_FALSE(t.Covered(2, p, 1));
  t.Open(4);  // and the next step waits for its bytes again
  CHECK_FALSE(t.Covered(4, p, 1));
}

// Issue 41, item 11: a relay used to ask Covered for every waiting op on every landing, under
// the lock each incoming write takes. Its waiting ops are indexed by address now, and each pass
// looks only at the ranges that grew (TakeTouched).
TEST_CASE("landing tracker: the ranges that grew since the last look, as they are now") {
  executor::LandingTracker t;
  std::vector<uint8_t> memory(1 << 20);
  uint8_t* p = memory.data();
  const auto at = [&](uint64_t off) { return reinterpret_cast<uintptr_t>(p + off); };
  std::vector<executor::LandingTracker::Range> touched;
  t.Open(5);
  t.Landed(5, p, 100);
  t.Landed(5, p + 100, 50);  // merges with the first
  t.Landed(5, p + 4096, 10);
  t.Landed(6, p + 8192, 10);  // another step's: never listed
  REQUIRE(t.TakeTouched(5, &touched));
  REQUIRE(touched.size() == 2);
  CHECK(touched[0].begin == at(0));
  CHECK(touched[0].end == at(150));
  CHECK(touched[1].begin == at(4096));
  CHECK(touched[1].end == at(4106));
  REQUIRE(t.TakeTouched(5, &touched));
  CHECK(touched.empty());  // nothing new
  // More landings than it keeps between two looks: "look at every waiting op".
  for (uint64_t i = 0; i <= executor::LandingTracker::kMaxTouched; ++i) {
    t.Landed(5, p + 16384 + 2 * i, 1);
  }
  CHECK_FALSE(t.TakeTouched(5, &touched));
  REQUIRE(t.TakeTouched(5, &touched));
  t.LandAll(5);
  CHECK_FALSE(t.TakeTouched(5, &touched));
}
