// The executor end to end inside one process, through the real local and tcp transports:
// many operations (copies, casts, BF16 -> FP8), every destination byte checked, staging in
// flight never above the watermark, and an injected transport failure naming its operation.
#include "daemon/executor/executor.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <mutex>
#include <random>

#include "config/config.h"
#include "daemon/executor/op_preparer.h"
#include "daemon/registry/region_registry.h"
#include "daemon/service/peer_connector.h"
#include "daemon/transform/transform.h"
#include "daemon/transport/factory.h"

namespace v1 = weightbeam::v1;
using namespace wb;

namespace {

class HeapHold : public registry::MemoryHold {
 public:
  explicit HeapHold(size_t n) : bytes(n) {}
  std::vector<uint8_t> bytes;
};

// Test memory: the handle's shm name picks a heap buffer the test can see.
struct Memory {
  std::map<std::string, std::shared_ptr<HeapHold>> buffers;
  registry::MemoryOpener Opener() {
    return [this](const v1::MemoryHandle& h,
                  const registry::Caller&) -> absl::StatusOr<registry::OpenedMemory> {
      auto& b = buffers[h.host_shm().shm_name()];
      if (!b) b = std::make_shared<HeapHold>(h.host_shm().length());
      registry::OpenedMemory m;
      m.ref = {b->bytes.data(), b->bytes.size(), transport::MemoryKind::kHost, -1};
      m.location = "host";
      m.hold = b;
      return m;
    };
  }
};

v1::TensorRegistration Reg(const std::string& name, v1::DType dtype, int64_t rows, int64_t cols) {
  v1::TensorRegistration r;
  r.mutable_spec()->set_name(name);
  r.mutable_spec()->set_dtype(dtype);
  r.mutable_spec()->add_global_shape(rows);
  r.mutable_spec()->add_global_shape(cols);
  r.mutable_memory()->mutable_host_shm()->set_shm_name("/" + name);
  r.mutable_memory()->mutable_host_shm()->set_length(static_cast<uint64_t>(rows * cols) *
                                                     (dtype == v1::DTYPE_F32       ? 4
                                                      : dtype == v1::DTYPE_F8_E4M3 ? 1
                                                                                   : 2));
  return r;
}

v1::Owner Owner(v1::Role role) {
  v1::Owner o;
  o.set_role(role);
  return o;
}

// A peer that fails every batch: the injected transport fault.
class FailingPeer : public transport::Peer {
 public:
  const std::string& name() const override { return name_; }
  absl::Status AddRemoteRegion(const v1::RegionDescriptor&) override { return absl::OkStatus(); }
  void RemoveRemoteRegion(uint64_t) override {}
  void PostBatch(std::vector<transport::WriteOp>, transport::BatchDone done) override {
    done(absl::UnavailableError("connection to agent far-node reset by peer (injected)"));
  }

 private:
  std::string name_ = "far-node";
};

struct Fixture {
  Memory memory;
  std::vector<std::unique_ptr<transport::Transport>> owned;
  std::map<std::string, transport::Transport*> by_name;
  std::unique_ptr<registry::RegionRegistry> registry;
  std::unique_ptr<executor::StagingPool> staging;
  executor::OpPreparer preparer;
  std::unique_ptr<executor::Executor> exec;

  explicit Fixture(const std::string& transport_name, uint64_t watermark) {
    config::AgentConfig cfg;
    cfg.tcp.listen = "127.0.0.1:0";
    for (const std::string& name : {std::string("local"), transport_name}) {
      if (by_name.count(name)) continue;
      auto t = transport::MakeTransport(name, cfg);
      REQUIRE(t.ok());
      by_name[name] = t->get();
      owned.push_back(std::move(*t));
    }
    std::vector<transport::Transport*> raw;
    for (auto& t : owned) raw.push_back(t.get());
    registry = std::make_unique<registry::RegionRegistry>(raw, memory.Opener());
    staging = std::make_unique<executor::StagingPool>(watermark, raw);
    exec = std::make_unique<executor::Executor>(registry.get(), staging.get(), &preparer,
                                                executor::ExecutorOptions{});
  }

  v1::TensorLayout Register(const v1::TensorRegistration& r, v1::Role role) {
    auto l = registry->Register(role == v1::ROLE_TRAINER ? 1 : 2, Owner(role), r);
    REQUIRE(l.ok());
    return *l;
  }
  std::vector<uint8_t>& Bytes(const std::string& name) { return memory.buffers["/" + name]->bytes; }
};

void FillRandom(std::vector<uint8_t>& b, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < b.size(); i += 2) {
    // Finite BF16 values: random sign/mantissa, exponent kept moderate.
    uint16_t v = static_cast<uint16_t>((rng() & 0x807f) | ((0x70 + rng() % 16) << 7));
    std::memcpy(&b[i], &v, 2);
  }
}

}  // namespace

TEST_CASE("a plan of many operations lands every byte, under the staging watermark") {
  const std::string transport_name = GENERATE(std::string("local"), std::string("tcp"));
  INFO("transport " << transport_name);
  // Above the largest single op (an FP8 block row: 64 KiB + scales), far below the total.
  const uint64_t watermark = 96 * 1024;
  Fixture f(transport_name, watermark);

  // Sources (trainer) and destinations (inference) of 256 x 512 elements each.
  const int64_t R = 256, C = 512;
  auto src = f.Register(Reg("src", v1::DTYPE_BF16, R, C), v1::ROLE_TRAINER);
  auto dst_copy = f.Register(Reg("dst_copy", v1::DTYPE_BF16, R, C), v1::ROLE_INFERENCE);
  auto dst_cast = f.Register(Reg("dst_cast", v1::DTYPE_F32, R, C), v1::ROLE_INFERENCE);
  auto dst_fp8 = f.Register(Reg("dst_fp8", v1::DTYPE_F8_E4M3, R, C), v1::ROLE_INFERENCE);
  auto dst_scale =
      f.Register(Reg("dst_fp8_scale", v1::DTYPE_F32, R / 128, C / 128), v1::ROLE_INFERENCE);
  FillRandom(f.Bytes("src"), 7);

  std::vector<v1::TransferOp> ops;
  uint64_t id = 0;
  // An op from `src` starting at row r, whole rows of BF16 unless changed after.
  auto from_src = [&](const std::string& dst, const auto& dst_reg, v1::DType dst_dtype,
                      v1::Transform transform, int64_t r, int64_t rows, uint32_t phase) {
    v1::TransferOp op;
    op.set_op_id(id++);
    op.set_dst_agent("self");
    op.set_src_tensor("src");
    op.set_dst_tensor(dst);
    op.set_src_region(src.region().region_id());
    op.set_dst_region(dst_reg.region().region_id());
    op.set_src_offset(r * C * 2);
    op.set_rows(rows);
    op.set_row_elems(C);
    op.set_src_dtype(v1::DTYPE_BF16);
    op.set_dst_dtype(dst_dtype);
    op.set_transform(transform);
    op.set_phase(phase);
    return op;
  };
  // Copies: one op per 8 rows, and a strided op for the right half of every row.
  for (int64_t r = 0; r < R; r += 8) {
    v1::TransferOp op =
        from_src("dst_copy", dst_copy, v1::DTYPE_BF16, v1::TRANSFORM_COPY, r, 8, /*phase=*/0);
    op.set_dst_offset(r * C * 2);
    op.set_row_elems(C / 2);  // left half, strided
    op.set_src_stride(C * 2);
    op.set_dst_stride(C * 2);
    ops.push_back(op);
    op.set_op_id(id++);
    op.set_src_offset(r * C * 2 + C);  // right half
    op.set_dst_offset(r * C * 2 + C);
    ops.push_back(op);
  }
  // Casts to f32, 16 rows per op, in phase 1.
  for (int64_t r = 0; r < R; r += 16) {
    v1::TransferOp op =
        from_src("dst_cast", dst_cast, v1::DTYPE_F32, v1::TRANSFORM_CAST, r, 16, /*phase=*/1);
    op.set_dst_offset(r * C * 4);
    ops.push_back(op);
  }
  // FP8: one op per 128-row block row, scales to the scale tensor.
  for (int64_t r = 0; r < R; r += 128) {
    v1::TransferOp op = from_src("dst_fp8", dst_fp8, v1::DTYPE_F8_E4M3, v1::TRANSFORM_FP8_BLOCK, r,
                                 128, /*phase=*/1);
    op.set_dst_offset(r * C);
    op.set_scale_region(dst_scale.region().region_id());
    op.set_scale_offset((r / 128) * (C / 128) * 4);
    ops.push_back(op);
  }

  // Route to ourselves over the transport under test.
  service::PeerConnector connector("self", {{transport_name, f.by_name[transport_name]}});
  v1::PeerIntro peer;
  peer.set_agent(transport_name == "local" ? "self" : "self-over-tcp");
  for (const auto& nic : f.by_name[transport_name]->Nics()) *peer.add_nics() = nic;
  for (const auto* l : {&dst_copy, &dst_cast, &dst_fp8, &dst_scale}) {
    *peer.add_regions() = l->region();
  }
  if (transport_name != "local") {
    for (auto& op : ops) op.set_dst_agent(peer.agent());
    // A tcp "peer" that is this process: the handshake goes straight to our own Accept.
    auto* t = f.by_name["tcp"];
    auto p = t->Connect("self", peer.agent(),
                        [t](const std::string& ours) { return t->Accept("self", ours); });
    REQUIRE(p.ok());
    executor::Route route;
    route.peer = *p;
    route.transport = t;
    for (const auto& merged : peer.regions()) {
      v1::RegionDescriptor own;
      own.set_length(merged.length());
      for (const auto& k : merged.keys()) {
        if (k.transport() != "tcp") continue;
        own.set_region_id(k.transport_region());
        *own.add_keys() = k;
      }
      REQUIRE((*p)->AddRemoteRegion(own).ok());
      route.remote_regions[merged.region_id()] = {own.region_id(), 0, merged.length()};
    }
    f.exec->Load(ops, {{peer.agent(), route}});
  } else {
    auto routes = connector.Connect({peer});
    REQUIRE(routes.ok());
    f.exec->Load(ops, std::move(*routes));
  }

  uint64_t staging_needed = 0;
  for (const auto& op : ops) staging_needed += f.preparer.StagingBytes(op);
  REQUIRE(staging_needed > 4 * watermark);  // the watermark really has to hold them back

  v1::AgentStepReport report = f.exec->Execute(1, std::chrono::seconds(30));
  INFO(report.error());
  REQUIRE(report.ok());
  CHECK(report.ops() == ops.size());
  // Staging is what the transforms needed; the pool never handed out more than the watermark.
  CHECK(report.stages().peak_staging_bytes() > 0);
  CHECK(report.stages().peak_staging_bytes() <= watermark);

  // Every destination byte, checked against the transform library on the whole tensor.
  CHECK(f.Bytes("dst_copy") == f.Bytes("src"));
  const transform::TransformDesc cast{transform::Kind::kCast, transform::DType::kBF16,
                                      transform::DType::kF32, R, C};
  std::vector<uint8_t> want_cast(R * C * 4);
  REQUIRE(transform::ApplyTransformCpu(cast, f.Bytes("src").data(), want_cast.data()).ok());
  CHECK(f.Bytes("dst_cast") == want_cast);
  const transform::TransformDesc q{transform::Kind::kFp8Block, transform::DType::kBF16,
                                   transform::DType::kF8E4M3, R, C};
  std::vector<uint8_t> want_fp8(R * C);
  std::vector<float> want_scales((R / 128) * (C / 128));
  REQUIRE(
      transform::ApplyTransformCpu(q, f.Bytes("src").data(), want_fp8.data(), want_scales.data())
          .ok());
  CHECK(f.Bytes("dst_fp8") == want_fp8);
  CHECK(std::memcmp(f.Bytes("dst_fp8_scale").data(), want_scales.data(), want_scales.size() * 4) ==
        0);
}

TEST_CASE("an operation larger than the watermark runs alone instead of deadlocking") {
  Fixture f("local", 4096);
  auto src = f.Register(Reg("big_src", v1::DTYPE_BF16, 64, 256), v1::ROLE_TRAINER);
  auto dst = f.Register(Reg("big_dst", v1::DTYPE_F32, 64, 256), v1::ROLE_INFERENCE);
  FillRandom(f.Bytes("big_src"), 3);
  v1::TransferOp op;
  op.set_dst_agent("self");
  op.set_src_region(src.region().region_id());
  op.set_dst_region(dst.region().region_id());
  op.set_rows(64);
  op.set_row_elems(256);
  op.set_src_dtype(v1::DTYPE_BF16);
  op.set_dst_dtype(v1::DTYPE_F32);
  op.set_transform(v1::TRANSFORM_CAST);
  service::PeerConnector connector("self", {{"local", f.by_name["local"]}});
  v1::PeerIntro peer;
  peer.set_agent("self");
  *peer.add_regions() = dst.region();
  auto routes = connector.Connect({peer});
  REQUIRE(routes.ok());
  f.exec->Load({op, op}, std::move(*routes));
  auto report = f.exec->Execute(1, std::chrono::seconds(10));
  INFO(report.error());
  REQUIRE(report.ok());
  CHECK(report.stages().peak_staging_bytes() == 64 * 256 * 4);  // one at a time
}

TEST_CASE("a staging lease holds its bytes against the watermark until it goes away") {
  executor::StagingPool pool(8192, {});
  const std::atomic<bool> cancelled{false};
  {
    auto a = pool.Acquire(4096, &cancelled);
    REQUIRE(a.ok());
    CHECK(pool.in_flight() == 4096);
    executor::StagingLease moved = std::move(*a);  // the charge moves with the lease
    CHECK_FALSE(*a);
    CHECK(pool.in_flight() == 4096);
    auto b = pool.Acquire(4096, &cancelled);
    REQUIRE(b.ok());
    CHECK(pool.in_flight() == 8192);
    b->Release();
    CHECK_FALSE(*b);
    CHECK(pool.in_flight() == 4096);
  }
  CHECK(pool.in_flight() == 0);
  CHECK(pool.peak_in_flight() == 8192);
}

// One bf16 8x8 copy, op `op_id`, of trainer tensor `name` to the same name on "far-node"
// (its region 99), which is reached through `peer`: registered and loaded on `f`.
void LoadCopyTo(Fixture* f, std::shared_ptr<transport::Peer> peer, const std::string& name = "w",
                uint64_t op_id = 1) {
  auto src = f->Register(Reg(name, v1::DTYPE_BF16, 8, 8), v1::ROLE_TRAINER);
  v1::TransferOp op;
  op.set_op_id(op_id);
  op.set_dst_agent("far-node");
  op.set_src_tensor(name);
  op.set_dst_tensor(name);
  op.set_src_region(src.region().region_id());
  op.set_dst_region(99);
  op.set_rows(8);
  op.set_row_elems(8);
  op.set_src_dtype(v1::DTYPE_BF16);
  op.set_dst_dtype(v1::DTYPE_BF16);
  op.set_transform(v1::TRANSFORM_COPY);
  executor::Route route;
  route.peer = std::move(peer);
  route.transport = f->by_name["local"];
  route.remote_regions[99] = {1, 0, uint64_t{1} << 30};
  f->exec->Load({op}, {{"far-node", route}});
}

TEST_CASE("an injected transport failure aborts the step naming the operation") {
  Fixture f("local", 1 << 20);
  LoadCopyTo(&f, std::make_shared<FailingPeer>(), "layers.3.mlp.down_proj.weight", 41);
  auto report = f.exec->Execute(5, std::chrono::seconds(10));
  CHECK_FALSE(report.ok());
  CHECK_THAT(report.error(), Catch::Contains("op 41 (layers.3.mlp.down_proj.weight -> "
                                             "far-node:layers.3.mlp.down_proj.weight)") &&
                                 Catch::Contains("reset by peer (injected)"));
}

// A peer that records each write's step and completes batches at once, or holds them until
// Abandon (a receiver that stopped draining).
class StepPeer : public transport::Peer {
 public:
  explicit StepPeer(bool hold) : hold_(hold) {}
  const std::string& name() const override { return name_; }
  absl::Status AddRemoteRegion(const v1::RegionDescriptor&) override { return absl::OkStatus(); }
  void RemoveRemoteRegion(uint64_t) override {}
  void PostBatch(std::vector<transport::WriteOp> ops, transport::BatchDone done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++batches_;
      for (const auto& w : ops) steps_.push_back(w.step);
      if (hold_) {
        held_.push_back(std::move(done));
        return;
      }
    }
    done(absl::OkStatus());
  }
  void Abandon(const std::string& reason) override {
    std::vector<transport::BatchDone> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++abandoned_;
      held.swap(held_);
    }
    for (auto& done : held) done(absl::CancelledError(reason));
  }
  std::vector<uint64_t> steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  int abandoned() {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_;
  }
  int batches() {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }

 private:
  const bool hold_;
  std::string name_ = "far-node";
  std::mutex mu_;
  std::vector<uint64_t> steps_;
  std::vector<transport::BatchDone> held_;
  int abandoned_ = 0;
  int batches_ = 0;
};

// `n` zero-copy ops of one 128 KiB BF16 row each from one source to agent far-node.
void LoadRowsTo(Fixture* f, std::shared_ptr<transport::Peer> peer, int n) {
  const int64_t cols = 64 << 10;
  auto src = f->Register(Reg("rows", v1::DTYPE_BF16, n, cols), v1::ROLE_TRAINER);
  std::vector<v1::TransferOp> ops;
  for (int i = 0; i < n; ++i) {
    v1::TransferOp op;
    op.set_op_id(100 + i);
    op.set_dst_agent("far-node");
    op.set_src_tensor("rows");
    op.set_dst_tensor("rows");
    op.set_src_region(src.region().region_id());
    op.set_src_offset(i * cols * 2);
    op.set_dst_region(99);
    op.set_dst_offset(i * cols * 2);
    op.set_rows(1);
    op.set_row_elems(cols);
    op.set_src_dtype(v1::DTYPE_BF16);
    op.set_dst_dtype(v1::DTYPE_BF16);
    op.set_transform(v1::TRANSFORM_COPY);
    ops.push_back(op);
  }
  executor::Route route;
  route.peer = std::move(peer);
  route.transport = f->by_name["local"];
  route.remote_regions[99] = {1, 0, uint64_t{1} << 30};
  f->exec->Load(ops, {{"far-node", route}});
}

TEST_CASE("zero-copy ops to one agent go in batches of up to 4 MiB; a failure names the batch") {
  Fixture f("local", 1 << 20);
  auto peer = std::make_shared<StepPeer>(/*hold=*/false);
  LoadRowsTo(&f, peer, 64);  // 8 MiB in 64 ops
  auto report = f.exec->Execute(1, std::chrono::seconds(10), {}, {}, 5);
  INFO(report.error());
  REQUIRE(report.ok());
  CHECK(report.ops() == 64);
  CHECK(report.bytes_sent() == uint64_t{8} << 20);
  CHECK(peer->batches() == 2);
  CHECK(peer->steps() == std::vector<uint64_t>(64, 5));  // every op's write, in its step
  CHECK(f.exec->ops_in_flight() == 0);

  Fixture g("local", 1 << 20);
  LoadRowsTo(&g, std::make_shared<FailingPeer>(), 3);
  report = g.exec->Execute(1, std::chrono::seconds(10));
  CHECK_FALSE(report.ok());
  CHECK_THAT(report.error(), Catch::Contains("op 100 (rows -> far-node:rows) (in one batch with "
                                             "2 more ops)") &&
                                 Catch::Contains("reset by peer (injected)"));
}

TEST_CASE("every write carries its step; aborts name the step they are for") {
  Fixture f("local", 1 << 20);
  auto peer = std::make_shared<StepPeer>(/*hold=*/false);
  LoadCopyTo(&f, peer);
  const auto t = std::chrono::seconds(10);

  auto report = f.exec->Execute(1, t, {}, {}, 111);
  INFO(report.error());
  REQUIRE(report.ok());
  CHECK(peer->steps() == std::vector<uint64_t>{111});
  // An abort that arrives before its step's Execute: that Execute fails at once, sends nothing.
  f.exec->Cancel(222, "aborted by the controller");
  report = f.exec->Execute(2, t, {}, {}, 222);
  CHECK_FALSE(report.ok());
  CHECK_THAT(report.error(), Catch::Contains("aborted before it started"));
  CHECK(peer->steps().size() == 1);
  // A late abort of a step that already ran leaves the next step alone, and a step that ran
  // may run again (the controller retries without a dropped receiver).
  f.exec->Cancel(111, "late");
  report = f.exec->Execute(3, t, {}, {}, 333);
  CHECK(report.ok());
  f.exec->Cancel(333, "a colocated receiver was dropped");
  report = f.exec->Execute(3, t, {}, {}, 333);
  CHECK(report.ok());
  CHECK(peer->steps() == std::vector<uint64_t>{111, 333, 333});
}

TEST_CASE("batches outstanding at the deadline are abandoned, not left queued") {
  Fixture f("local", 1 << 20);
  auto peer = std::make_shared<StepPeer>(/*hold=*/true);
  LoadCopyTo(&f, peer);
  auto report = f.exec->Execute(1, std::chrono::milliseconds(300), {}, {}, 7);
  CHECK_FALSE(report.ok());
  CHECK_THAT(report.error(), Catch::Contains("slow peer"));
  CHECK(peer->abandoned() == 1);
  CHECK(f.exec->ops_in_flight() == 0);  // the abandoned batch completed before Execute returned
}

TEST_CASE("SortByPhase orders ops by phase, keeping each phase's order; sorted input stays as is") {
  auto ops_with = [](std::vector<std::pair<int, uint64_t>> phase_and_id) {
    executor::OpList ops;
    for (auto [phase, id] : phase_and_id) {
      v1::TransferOp* op = ops.Add();
      op->set_phase(phase);
      op->set_src_offset(id);  // names the op
    }
    return ops;
  };
  auto ids = [](const executor::OpList& ops) {
    std::vector<std::pair<int, uint64_t>> out;
    for (const auto& op : ops) out.emplace_back(op.phase(), op.src_offset());
    return out;
  };
  auto shuffled = ops_with({{2, 1}, {0, 2}, {1, 3}, {0, 4}, {2, 5}, {1, 6}, {0, 7}});
  executor::SortByPhase(&shuffled);
  CHECK(ids(shuffled) == std::vector<std::pair<int, uint64_t>>{
                             {0, 2}, {0, 4}, {0, 7}, {1, 3}, {1, 6}, {2, 1}, {2, 5}});
  auto sorted = ops_with({{0, 9}, {0, 8}, {1, 7}, {3, 6}, {3, 5}});
  const auto before = ids(sorted);
  executor::SortByPhase(&sorted);
  CHECK(ids(sorted) == before);
}
