// Delta mode into GPU memory: a destination copied to the device, the same packed deltas
// applied there by the CUDA scatter (ResolveDelta + GpuApplier) and on the host by
// ApplyToDestination, then compared byte for byte (element sizes 1, 2 and 4, FP8 with scales,
// strided rows), and the device hash equal to the host hash. Without a device the cases report
// "skipped: ..." and only check that the GPU path says why it cannot run.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "daemon/delta/delta_codec.h"
#include "daemon/delta/gpu_apply.h"
#include "daemon/delta/op_layout.h"
#include "daemon/gpu/device_memory.h"
#include "tests/transform/transfer_ops.h"

namespace wb::delta {
namespace {

namespace v1 = weightbeam::v1;

constexpr size_t kRegionBytes = 1 << 20;

bool HaveDevice() {
  absl::Status s = GpuScatterAvailable();
  if (!s.ok()) WARN("skipped: " << s.message());
  return s.ok();
}

void DenseWrite(const OpLayout& l, const std::vector<uint8_t>& flat, std::vector<uint8_t>* data,
                std::vector<uint8_t>* scales) {
  for (const Segment& s : l.segments) {
    auto& region = s.scales ? *scales : *data;
    std::memcpy(region.data() + s.dst_offset, flat.data() + s.flat_offset, s.length);
  }
}

gpu::DeviceBuffer Upload(const std::vector<uint8_t>& host) {
  auto buf = gpu::DeviceBuffer::Allocate(host.size());
  REQUIRE(buf.ok());
  REQUIRE(gpu::CopyHostToDevice(buf->data(), host.data(), host.size()).ok());
  return std::move(*buf);
}

std::vector<uint8_t> Download(const gpu::DeviceBuffer& buf) {
  std::vector<uint8_t> host(buf.size());
  REQUIRE(gpu::CopyDeviceToHost(host.data(), buf.data(), host.size()).ok());
  return host;
}

// Two steps of sparse changes (the second with more, so the staging buffer grows), each applied
// on the host and on the device; both destinations must stay byte-identical.
void CheckOp(const v1::TransferOp& op, uint32_t seed) {
  const OpLayout layout = LayoutOf(op);
  std::vector<uint8_t> host_data = wb::testing::RandomBytes(kRegionBytes, seed);
  std::vector<uint8_t> host_scales = wb::testing::RandomBytes(kRegionBytes, seed + 1);
  std::vector<uint8_t> shadow = wb::testing::RandomBytes(layout.flat_bytes, seed + 2);
  DenseWrite(layout, shadow, &host_data, &host_scales);
  gpu::DeviceBuffer dev_data = Upload(host_data);
  gpu::DeviceBuffer dev_scales = Upload(host_scales);
  const DestinationMemory dst{static_cast<uint8_t*>(dev_data.data()), true, 0};
  const DestinationMemory scales{static_cast<uint8_t*>(dev_scales.data()), true, 0};
  GpuApplier applier;
  std::mt19937 rng(seed + 3);
  for (int step = 1; step <= 2; ++step) {
    INFO("step " << step);
    std::vector<uint8_t> next = shadow;
    next.front() ^= 1;  // both ends
    next.back() ^= 0x80;
    for (size_t i = 0; i < next.size(); ++i) {
      if (rng() % 100 < static_cast<unsigned>(step * 2)) next[i] ^= static_cast<uint8_t>(1 + i);
    }
    auto enc = EncodeDelta(absl::MakeSpan(shadow), next, layout.elem_size);
    REQUIRE(enc.ok());
    REQUIRE(enc->kind == DeltaEncoding::Kind::kPacked);
    REQUIRE(ApplyToDestination(enc->packed, layout, host_data.data(), host_scales.data()).ok());
    auto list = ResolveDelta(enc->packed, layout);
    REQUIRE(list.ok());
    absl::Status s = applier.Scatter(*list, dst, scales, op.dst_tensor());
    INFO(s.message());
    REQUIRE(s.ok());
    CHECK(Download(dev_data) == host_data);
    CHECK(Download(dev_scales) == host_scales);
    auto hash = applier.Hash(layout, dst, scales, op.dst_tensor());
    REQUIRE(hash.ok());
    CHECK(*hash == HashDestination(layout, host_data.data(), host_scales.data()));
  }
}

}  // namespace

TEST_CASE("without a device the GPU scatter says why it cannot run", "[delta][cuda]") {
  if (GpuScatterAvailable().ok()) return;
  const std::string why(GpuScatterAvailable().message());
  CHECK((why.find("no CUDA device") != std::string::npos ||
         why.find("built without CUDA") != std::string::npos));
  ScatterList list;
  list.elem_size = 2;
  list.data_offsets = {0};
  list.data_values = {1, 2};
  uint8_t not_device[2] = {};
  GpuApplier applier;
  absl::Status s = applier.Scatter(list, {not_device, true, 0}, {}, "model.embed_tokens.weight");
  REQUIRE_FALSE(s.ok());
  const std::string msg(s.message());
  INFO(msg);
  CHECK(msg.rfind("scattering a delta of tensor 'model.embed_tokens.weight': ", 0) == 0);
  CHECK((msg.find("on CUDA device 0: ") != std::string::npos ||
         msg.find("built without CUDA") != std::string::npos));
  CHECK(not_device[0] == 0);
}

TEST_CASE("GPU scatter of 1-byte elements into strided rows", "[delta][cuda]") {
  if (!HaveDevice()) return;
  CheckOp(wb::testing::StridedCopy(v1::DTYPE_F8_E4M3, 97, 301, 5, 24), 10);
}

TEST_CASE("GPU scatter of BF16 elements into strided, unaligned rows", "[delta][cuda]") {
  if (!HaveDevice()) return;
  CheckOp(wb::testing::StridedCopy(v1::DTYPE_BF16, 64, 1000, 3, 24), 20);
}

TEST_CASE("GPU scatter of F32 elements into strided rows", "[delta][cuda]") {
  if (!HaveDevice()) return;
  CheckOp(wb::testing::StridedCopy(v1::DTYPE_F32, 33, 500, 1, 24), 30);
}

TEST_CASE("GPU scatter of an FP8 op: ragged blocks, strided scales, padding", "[delta][cuda]") {
  if (!HaveDevice()) return;
  CheckOp(wb::testing::RaggedFp8(131, 201, 8, 201 + 3), 40);  // rows not aligned
}

}  // namespace wb::delta
