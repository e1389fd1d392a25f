// CUDA sources in the executor without a GPU: transforms, strided gathers and the delta compare
// must never read a CUDA region as host memory. A region registered as cuda:0 (host bytes
// behind it, so a wrong host read would silently "work") must fail the step cleanly, naming the
// operation, the tensor and the device; the dispatch between the host and device delta paths
// and the host copy's geometry are checked directly.
#include "daemon/executor/gpu_source.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/delta/delta_sender.h"
#include "daemon/executor/executor.h"
#include "daemon/executor/op_preparer.h"
#include "daemon/gpu/device_memory.h"
#include "daemon/registry/region_registry.h"

namespace v1 = weightbeam::v1;
using namespace wb;

namespace {

class HeapHold : public registry::MemoryHold {
 public:
  explicit HeapHold(size_t n) : bytes(n, 0x3f) {}
  std::vector<uint8_t> bytes;
};

// A peer that must never be reached: every op here fails before its write.
class UnreachedPeer : public transport::Peer {
 public:
  const std::string& name() const override { return name_; }
  absl::Status AddRemoteRegion(const v1::RegionDescriptor&) override { return absl::OkStatus(); }
  void RemoveRemoteRegion(uint64_t) override {}
  void PostBatch(std::vector<transport::WriteOp>, transport::BatchDone done) override {
    ++posted;
    done(absl::InternalError("a write was posted"));
  }
  int posted = 0;

 private:
  std::string name_ = "infer-node";
};

constexpr int64_t kRows = 16, kCols = 64;

// A trainer tensor whose memory claims to be CUDA memory on device 0 (the opener says so; the
// registry has no transport that would check it).
struct CudaSourceFixture {
  std::shared_ptr<HeapHold> hold = std::make_shared<HeapHold>(kRows * kCols * 2);
  registry::RegionRegistry registry{
      {},
      [this](const v1::MemoryHandle&,
             const registry::Caller&) -> absl::StatusOr<registry::OpenedMemory> {
        registry::OpenedMemory m;
        m.ref = {hold->bytes.data(), hold->bytes.size(), transport::MemoryKind::kCuda, 0};
        m.location = "cuda:0";
        m.hold = hold;
        return m;
      }};
  executor::StagingPool staging{1 << 20, {}};
  executor::OpPreparer preparer;
  executor::Executor exec{&registry, &staging, &preparer, executor::ExecutorOptions{}};
  std::shared_ptr<UnreachedPeer> peer = std::make_shared<UnreachedPeer>();
  uint64_t region = 0;

  CudaSourceFixture() {
    v1::TensorRegistration r;
    r.mutable_spec()->set_name("gsrc");
    r.mutable_spec()->set_dtype(v1::DTYPE_BF16);
    r.mutable_spec()->add_global_shape(kRows);
    r.mutable_spec()->add_global_shape(kCols);
    r.mutable_memory()->mutable_cuda_ipc()->set_ipc_handle(std::string(64, 'h'));
    r.mutable_memory()->mutable_cuda_ipc()->set_length(kRows * kCols * 2);
    v1::Owner o;
    o.set_role(v1::ROLE_TRAINER);
    auto l = registry.Register(1, o, r);
    REQUIRE(l.ok());
    CHECK(l->location() == "cuda:0");
    region = l->region().region_id();
  }

  v1::TransferOp Op(uint64_t id, v1::Transform transform, v1::DType dst) const {
    v1::TransferOp op;
    op.set_op_id(id);
    op.set_dst_agent("infer-node");
    op.set_src_tensor("gsrc");
    op.set_dst_tensor("gdst");
    op.set_src_region(region);
    op.set_dst_region(7);
    op.set_rows(kRows);
    op.set_row_elems(kCols);
    op.set_src_dtype(v1::DTYPE_BF16);
    op.set_dst_dtype(dst);
    op.set_transform(transform);
    return op;
  }

  v1::AgentStepReport Run(const v1::TransferOp& op, bool delta) {
    executor::Route route;
    route.peer = peer;
    route.remote_regions[7] = {1, 0, uint64_t{1} << 30};
    std::shared_ptr<delta::DeltaSender> sender;
    delta::StepDelta step;
    if (delta) {
      v1::AgentPlan plan;
      *plan.add_ops() = op;
      sender = std::make_shared<delta::DeltaSender>(plan);
      step.enabled = true;
      step.anchor = true;
    }
    exec.Load({op}, {{"infer-node", route}}, sender);
    return exec.Execute(3, std::chrono::seconds(10), step);
  }
};

// What this machine says about CUDA: without a device (or without the toolkit) the copy fails
// with that reason; with a device, host memory labelled cuda:0 is refused as not device memory.
std::string ExpectedCause() {
  auto s = gpu::CudaAvailable();
  return s.ok() ? std::string("not") : std::string(s.message());
}

}  // namespace

TEST_CASE("delta mode picks the device path only for in-place copies of CUDA memory") {
  const transport::MemoryRef host{nullptr, 64, transport::MemoryKind::kHost, -1};
  const transport::MemoryRef cuda{nullptr, 64, transport::MemoryKind::kCuda, 1};
  using executor::DeltaPath;
  CHECK(executor::ChooseDeltaPath(false, true, host) == DeltaPath::kHostInPlace);
  CHECK(executor::ChooseDeltaPath(false, true, cuda) == DeltaPath::kDeviceInPlace);
  CHECK(executor::ChooseDeltaPath(false, false, cuda) == DeltaPath::kStaged);
  CHECK(executor::ChooseDeltaPath(true, true, cuda) == DeltaPath::kStaged);
  CHECK(executor::ChooseDeltaPath(true, false, host) == DeltaPath::kStaged);
  CHECK(executor::IsDeviceSource(cuda));
  CHECK_FALSE(executor::IsDeviceSource(host));
}

TEST_CASE("the host copy of a CUDA source spans exactly the rows the op reads") {
  v1::TransferOp op;
  op.set_rows(4);
  op.set_row_elems(10);
  op.set_src_dtype(v1::DTYPE_BF16);
  CHECK(executor::SourceSpanBytes(op) == 4 * 20);
  op.set_src_stride(64);
  op.set_src_offset(1000);  // not part of the span
  CHECK(executor::SourceSpanBytes(op) == 3 * 64 + 20);
  op.set_rows(1);
  CHECK(executor::SourceSpanBytes(op) == 20);
  op.set_rows(0);
  CHECK(executor::SourceSpanBytes(op) == 0);
}

TEST_CASE("host sources are read where they are mapped, with the op unchanged") {
  std::vector<uint8_t> bytes(256);
  registry::RegisteredTensor t;
  t.spec.set_name("hsrc");
  t.memory = {bytes.data(), bytes.size(), transport::MemoryKind::kHost, -1};
  v1::TransferOp op;
  op.set_rows(2);
  op.set_row_elems(8);
  op.set_src_dtype(v1::DTYPE_BF16);
  op.set_src_offset(32);
  auto rows = executor::HostSourceRows::Read(op, t);
  REQUIRE(rows.ok());
  CHECK_FALSE(rows->copied());
  CHECK(rows->base() == bytes.data());
  CHECK(&rows->op() == &op);
}

TEST_CASE("a CUDA source read directly fails naming the tensor and device, never reads it") {
  std::vector<uint8_t> bytes(256, 0x11);
  registry::RegisteredTensor t;
  t.spec.set_name("layers.0.mlp.up_proj.weight");
  // Without a GPU any ordinal says "no device"; with one, cuda:0 exists, so the refusal is the
  // range's (host memory), not the ordinal's.
  const int device = gpu::CudaAvailable().ok() ? 0 : 2;
  t.memory = {bytes.data(), bytes.size(), transport::MemoryKind::kCuda, device};
  v1::TransferOp op;
  op.set_rows(2);
  op.set_row_elems(8);
  op.set_src_dtype(v1::DTYPE_BF16);
  auto rows = executor::HostSourceRows::Read(op, t);
  REQUIRE_FALSE(rows.ok());
  INFO(rows.status().ToString());
  CHECK_THAT(std::string(rows.status().message()),
             Catch::Contains("source tensor 'layers.0.mlp.up_proj.weight' on cuda:" +
                             std::to_string(device)) &&
                 Catch::Contains(ExpectedCause()));
  if (!gpu::CudaAvailable().ok()) {
    CHECK(rows.status().code() == absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("a step transforming a CUDA source without a GPU fails cleanly, naming op and tensor") {
  CudaSourceFixture f;
  for (auto transform : {v1::TRANSFORM_CAST, v1::TRANSFORM_FP8_BLOCK}) {
    const v1::DType dst = transform == v1::TRANSFORM_CAST ? v1::DTYPE_F32 : v1::DTYPE_F8_E4M3;
    auto report = f.Run(f.Op(12, transform, dst), false);
    INFO(report.error());
    CHECK_FALSE(report.ok());
    CHECK_THAT(report.error(), Catch::Contains("op 12 (gsrc -> infer-node:gdst)") &&
                                   Catch::Contains("source tensor 'gsrc' on cuda:0") &&
                                   Catch::Contains(ExpectedCause()));
  }
  CHECK(f.peer->posted == 0);
}

TEST_CASE("delta mode with a CUDA source without a GPU fails cleanly on both paths") {
  CudaSourceFixture f;
  SECTION("a contiguous copy goes to the GPU encoder") {
    auto report = f.Run(f.Op(5, v1::TRANSFORM_COPY, v1::DTYPE_BF16), true);
    INFO(report.error());
    CHECK_FALSE(report.ok());
    CHECK_THAT(report.error(), Catch::Contains("op 5 (gsrc -> infer-node:gdst)") &&
                                   Catch::Contains("delta encode on cuda:0"));
    if (!gpu::CudaAvailable().ok()) {
      CHECK_THAT(report.error(), Catch::Contains(ExpectedCause()));
    }
  }
  SECTION("a strided copy is gathered from a host copy") {
    auto op = f.Op(6, v1::TRANSFORM_COPY, v1::DTYPE_BF16);
    op.set_rows(kRows / 2);
    op.set_src_stride(kCols * 2 * 2);  // every other row
    auto report = f.Run(op, true);
    INFO(report.error());
    CHECK_FALSE(report.ok());
    CHECK_THAT(report.error(), Catch::Contains("op 6 (gsrc -> infer-node:gdst)") &&
                                   Catch::Contains("source tensor 'gsrc' on cuda:0") &&
                                   Catch::Contains(ExpectedCause()));
  }
  SECTION("a cast is transformed from a host copy") {
    auto report = f.Run(f.Op(7, v1::TRANSFORM_CAST, v1::DTYPE_F32), true);
    INFO(report.error());
    CHECK_FALSE(report.ok());
    CHECK_THAT(report.error(), Catch::Contains("source tensor 'gsrc' on cuda:0") &&
                                   Catch::Contains(ExpectedCause()));
  }
  CHECK(f.peer->posted == 0);
}

TEST_CASE("the delta sender's device path refuses unknown ops and says why it cannot run") {
  v1::AgentPlan plan;
  v1::TransferOp* op = plan.add_ops();
  op->set_op_id(9);
  op->set_rows(4);
  op->set_row_elems(256);
  op->set_src_dtype(v1::DTYPE_BF16);
  op->set_dst_dtype(v1::DTYPE_BF16);
  op->set_transform(v1::TRANSFORM_COPY);
  delta::DeltaSender sender(plan, 1, delta::ShadowPlacement::kHostMapped);
  CHECK(sender.gpu_shadow_placement() == delta::ShadowPlacement::kHostMapped);
  std::vector<uint8_t> bytes(4 * 256 * 2);
  std::vector<uint8_t> slot;
  delta::StepDelta step;
  step.enabled = true;
  v1::TransferOp unknown = *op;
  unknown.set_op_id(10);
  auto missing = sender.ProcessOnDevice(unknown, bytes.data(), 0, step, &slot);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("op 10"));
  auto no_device = sender.ProcessOnDevice(*op, bytes.data(), -1, step, &slot);
  REQUIRE_FALSE(no_device.ok());
  CHECK(no_device.status().code() == absl::StatusCode::kInvalidArgument);
  if (!gpu::CudaAvailable().ok()) {
    auto s = sender.ProcessOnDevice(*op, bytes.data(), 1, step, &slot);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(s.status().message()),
               Catch::Contains("delta encode on cuda:1") && Catch::Contains(ExpectedCause()));
    CHECK(slot.empty());
  }
  CHECK(sender.Layout(9) != nullptr);
  // The host path is untouched: a host anchor of the same op works without any GPU.
  auto host = sender.ProcessInPlace(*op, bytes.data(), step, &slot);
  REQUIRE(host.ok());
  CHECK_FALSE(host->packed);
  CHECK(sender.shadow_bytes() == bytes.size());
}
