// The transport suite with GPU regions: the same writes as transport_suite_test.cc with the
// source, the destination or both in device memory (tcp stages through pinned buffers, local
// copies with the CUDA driver). Without a CUDA device every case reports "skipped: ..." once.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "daemon/gpu/device_memory.h"
#include "daemon/gpu/staging.h"
#include "tests/transport/suite_util.h"

namespace wb::transport::testing {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kWait{20000};

bool HaveGpu(Transport* transport) {
  // rdma says it takes GPU memory whenever it was built with CUDA: a device must be there too.
  const absl::Status staging = gpu::StagingAvailable();
  if (transport->caps().gpu_memory && staging.ok()) return true;
  WARN(
      "skipped: " << BackendUnderTest() << " with GPU regions: "
                  << (staging.ok() ? "the transport does not take GPU memory" : staging.message()));
  return false;
}

// A patterned buffer in device memory, registered with `transport`.
struct GpuRegion {
  gpu::DeviceBuffer memory;
  std::vector<uint8_t> pattern;  // what was uploaded
  weightbeam::v1::RegionDescriptor desc;

  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> host(memory.size());
    REQUIRE(gpu::CopyDeviceToHost(host.data(), memory.data(), host.size()).ok());
    return host;
  }
};

std::unique_ptr<GpuRegion> RegisterGpu(Transport* transport, size_t size, Access access,
                                       uint32_t seed) {
  auto region = std::make_unique<GpuRegion>();
  auto memory = gpu::DeviceBuffer::Allocate(size, 0);
  INFO(memory.status().ToString());
  REQUIRE(memory.ok());
  region->memory = std::move(*memory);
  region->pattern = Pattern(size, seed);
  REQUIRE(gpu::CopyHostToDevice(region->memory.data(), region->pattern.data(), size).ok());
  MemoryRef mem{region->memory.data(), size, MemoryKind::kCuda, 0};
  auto desc = transport->Register(mem, access);
  INFO(desc.status().ToString());
  REQUIRE(desc.ok());
  region->desc = *desc;
  return region;
}

// Makes `dst` known to the pair's peer and copies the first `size` bytes of `src` into it in
// one batch, which must succeed.
void WriteWhole(Pair& pair, const weightbeam::v1::RegionDescriptor& src,
                const weightbeam::v1::RegionDescriptor& dst, size_t size) {
  REQUIRE(pair.peer->AddRemoteRegion(dst).ok());
  absl::Status st =
      pair.peer->WriteBatch({WriteOp{src.region_id(), 0, dst.region_id(), 0, size}}, kWait);
  INFO(st.ToString());
  REQUIRE(st.ok());
}

TEST_CASE("GPU source -> host destination: several MB land intact", "[transport][gpu]") {
  auto pair = MakePair();
  if (!HaveGpu(pair->sender)) return;
  const size_t size = 12 << 20;  // several frames, several staging chunks per connection
  auto src = RegisterGpu(pair->sender, size, Access::kSource, 31);
  auto dst = RegisterBuffer(pair->receiver, size, Access::kDestination, 32);
  WriteWhole(*pair, src->desc, dst->desc, size);
  CHECK(dst->bytes == src->pattern);
}

TEST_CASE("host source -> GPU destination: several MB land intact", "[transport][gpu]") {
  auto pair = MakePair();
  if (!HaveGpu(pair->receiver)) return;
  const size_t size = (12 << 20) + 4093;  // a ragged last chunk
  auto src = RegisterBuffer(pair->sender, size, Access::kSource, 33);
  auto dst = RegisterGpu(pair->receiver, size, Access::kDestination, 34);
  WriteWhole(*pair, src->desc, dst->desc, size);
  CHECK(dst->Download() == src->bytes);
}

TEST_CASE("GPU -> GPU: scattered writes land at their offsets, gaps untouched",
          "[transport][gpu]") {
  auto pair = MakePair();
  if (!HaveGpu(pair->sender)) return;
  const size_t size = 4 << 20;
  auto src = RegisterGpu(pair->sender, size, Access::kSource, 35);
  auto dst = RegisterGpu(pair->receiver, size, Access::kDestination, 36);
  REQUIRE(pair->peer->AddRemoteRegion(dst->desc).ok());
  std::vector<uint8_t> expected = dst->pattern;
  std::vector<WriteOp> ops;
  uint64_t dst_offset = 0;
  for (int i = 0; i < 300; ++i) {
    const uint64_t length = 1 + (i * 7919) % 9000;
    const uint64_t src_offset = (i * 104729) % (size - length);
    ops.push_back(
        WriteOp{src->desc.region_id(), src_offset, dst->desc.region_id(), dst_offset, length});
    std::memcpy(expected.data() + dst_offset, src->pattern.data() + src_offset, length);
    dst_offset += length + 17;
  }
  REQUIRE(dst_offset < size);
  absl::Status st = pair->peer->WriteBatch(ops, kWait);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(dst->Download() == expected);
}

TEST_CASE("a wrong key into a GPU region is refused and its bytes stay", "[transport][gpu]") {
  auto pair = MakePair();
  if (!HaveGpu(pair->receiver)) return;
  auto src = RegisterBuffer(pair->sender, 1 << 20, Access::kSource, 37);
  auto dst = RegisterGpu(pair->receiver, 1 << 20, Access::kDestination, 38);
  REQUIRE(pair->peer->AddRemoteRegion(WithKey(dst->desc, 42)).ok());
  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 1 << 20}}, kWait);
  CHECK_FALSE(st.ok());
  CHECK(dst->Download() == dst->pattern);
}

TEST_CASE("host memory registered as GPU memory is refused, naming the device",
          "[transport][gpu]") {
  auto transport = MakeBackend();
  if (!HaveGpu(transport.get())) return;
  std::vector<uint8_t> host(4096);
  auto desc =
      transport->Register({host.data(), host.size(), MemoryKind::kCuda, 0}, Access::kDestination);
  CHECK(absl::IsInvalidArgument(desc.status()));
  CHECK_THAT(std::string(desc.status().message()), Catch::Contains("cuda:0"));
}

TEST_CASE("registering GPU memory without a usable device says why", "[transport]") {
  auto transport = MakeBackend();
  if (transport->caps().gpu_memory) return;  // a GPU host: the cases above cover it
  static uint8_t fake[64];
  MemoryRef mem{fake, sizeof(fake), MemoryKind::kCuda, 0};
  auto desc = transport->Register(mem, Access::kDestination);
  const std::string msg(desc.status().message());
  INFO(msg);
  CHECK((desc.status().code() == absl::StatusCode::kUnimplemented ||
         desc.status().code() == absl::StatusCode::kFailedPrecondition));
  CHECK_THAT(msg, Catch::Contains("GPU memory (cuda:0)"));
  CHECK((msg.find("built without CUDA") != std::string::npos ||
         msg.find("no CUDA device") != std::string::npos));
}

}  // namespace
}  // namespace wb::transport::testing
