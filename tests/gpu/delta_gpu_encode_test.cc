// GPU delta encoding against the CPU codec on the same inputs: the same kind, the same packed
// bytes, the same changed count, and the shadow equal to the new version afterwards; for every
// element size, change density, index width, ragged and misaligned buffers, and both shadow
// placements. Without a device every case reports "skipped: ..." and returns.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "daemon/delta/delta_codec.h"
#include "daemon/delta/gpu_encoder.h"
#include "daemon/gpu/device_memory.h"

namespace wb::delta {
namespace {

bool HaveDevice() {
  absl::Status s = GpuEncodeAvailable();
  if (!s.ok()) WARN("skipped: GPU delta encode: " << s.message());
  return s.ok();
}

struct Case {
  std::vector<uint8_t> before, after;
};

// `rate`: fraction of elements changed; `runs`: changes come in bursts (big gaps between).
Case MakeCase(size_t bytes, int elem, double rate, uint32_t seed, bool bursts = false) {
  std::mt19937_64 rng(seed);
  Case c;
  c.before.resize(bytes);
  for (auto& b : c.before) b = static_cast<uint8_t>(rng());
  c.after = c.before;
  const size_t elems = bytes / elem;
  std::uniform_real_distribution<double> u(0, 1);
  for (size_t i = 0; i < elems; ++i) {
    const bool in_burst = !bursts || (i / 4096) % 64 == 0;
    if (in_burst && u(rng) < rate) c.after[i * elem + rng() % elem] ^= 1 + rng() % 255;
  }
  return c;
}

void CompareWithCpu(const Case& c, int elem, ShadowPlacement placement, size_t misalign = 0) {
  const size_t bytes = c.before.size();
  // CPU reference.
  std::vector<uint8_t> cpu_shadow = c.before;
  auto cpu = EncodeDelta(absl::MakeSpan(cpu_shadow), c.after, elem, 1);
  REQUIRE(cpu.ok());
  // GPU: `next` in device memory (optionally at a misaligned offset), the shadow seeded.
  GpuDeltaEncoder encoder(0);
  auto next = gpu::DeviceBuffer::Allocate(bytes + misalign + 1);
  REQUIRE(next.ok());
  auto* next_ptr = static_cast<uint8_t*>(next->data()) + misalign;
  REQUIRE(gpu::CopyHostToDevice(next_ptr, c.after.data(), bytes).ok());
  auto shadow = GpuShadow::Allocate(encoder.device_encoder(), bytes, placement);
  REQUIRE(shadow.ok());
  REQUIRE(encoder.Seed(*shadow, c.before.data(), bytes).ok());
  auto gpu = encoder.Encode(*shadow, next_ptr, bytes, elem);
  INFO(gpu.status().ToString());
  REQUIRE(gpu.ok());
  CHECK(gpu->kind == cpu->kind);
  if (cpu->kind == DeltaEncoding::Kind::kPacked) {
    CHECK(gpu->changed_elems == cpu->changed_elems);
    REQUIRE(gpu->packed.size() == cpu->packed.size());
    CHECK(gpu->packed == cpu->packed);
  } else {
    CHECK(gpu->changed_elems >= cpu->changed_elems);  // the CPU's is a lower bound
  }
  std::vector<uint8_t> shadow_now(bytes);
  REQUIRE(gpu::CopyDeviceToHost(shadow_now.data(), shadow->data(), bytes).ok());
  CHECK(shadow_now == c.after);
}

TEST_CASE("GPU delta encode is bit-identical to the CPU codec", "[gpu][delta]") {
  if (!HaveDevice()) return;
  uint32_t seed = 1;
  for (int elem : {1, 2, 4}) {
    for (size_t bytes : {size_t{0}, size_t{4}, size_t{16} * 3, size_t{16384}, size_t{16384} + 52,
                         size_t{3} << 20}) {
      if (bytes % elem != 0) continue;
      for (double rate : {0.0, 1e-4, 0.01, 0.3, 1.0}) {
        INFO("elem " << elem << ", bytes " << bytes << ", rate " << rate);
        CompareWithCpu(MakeCase(bytes, elem, rate, seed++), elem, ShadowPlacement::kDevice);
      }
    }
  }
}

TEST_CASE("GPU delta encode: wide gaps, misaligned buffers, host-mapped shadow", "[gpu][delta]") {
  if (!HaveDevice()) return;
  SECTION("bursts far apart need 4-byte gaps") {
    CompareWithCpu(MakeCase(size_t{64} << 20, 2, 0.001, 7, true), 2, ShadowPlacement::kDevice);
  }
  SECTION("a single change past 2^16 elements") {
    Case c = MakeCase(size_t{1} << 20, 2, 0, 8);
    c.after[(size_t{1} << 20) - 2] ^= 0x55;
    CompareWithCpu(c, 2, ShadowPlacement::kDevice);
  }
  SECTION("next at an offset that is not 16-byte aligned") {
    for (size_t misalign : {size_t{1}, size_t{2}, size_t{4}, size_t{8}}) {
      const int elem = misalign >= 4 ? 4 : static_cast<int>(misalign);
      INFO("misalign " << misalign);
      CompareWithCpu(MakeCase((size_t{1} << 20) + 4 * 3, elem, 0.01, 9), elem,
                     ShadowPlacement::kDevice, misalign);
    }
  }
  SECTION("shadow in mapped pinned host memory") {
    CompareWithCpu(MakeCase(size_t{8} << 20, 2, 0.01, 10), 2, ShadowPlacement::kHostMapped);
  }
}

TEST_CASE("GPU delta encode then apply on the CPU restores the new version", "[gpu][delta]") {
  if (!HaveDevice()) return;
  Case c = MakeCase(size_t{4} << 20, 2, 0.01, 11);
  GpuDeltaEncoder encoder(0);
  auto next = gpu::DeviceBuffer::Allocate(c.after.size());
  REQUIRE(next.ok());
  REQUIRE(gpu::CopyHostToDevice(next->data(), c.after.data(), c.after.size()).ok());
  auto shadow =
      GpuShadow::Allocate(encoder.device_encoder(), c.after.size(), ShadowPlacement::kDevice);
  REQUIRE(shadow.ok());
  REQUIRE(encoder.Seed(*shadow, c.before.data(), c.before.size()).ok());
  auto enc = encoder.Encode(*shadow, static_cast<uint8_t*>(next->data()), c.after.size(), 2);
  REQUIRE(enc.ok());
  REQUIRE(enc->kind == DeltaEncoding::Kind::kPacked);
  std::vector<uint8_t> receiver = c.before;
  REQUIRE(ApplyDelta(enc->packed, absl::MakeSpan(receiver)).ok());
  CHECK(receiver == c.after);
  // A second encode against the refreshed shadow finds nothing.
  auto again = encoder.Encode(*shadow, static_cast<uint8_t*>(next->data()), c.after.size(), 2);
  REQUIRE(again.ok());
  CHECK(again->changed_elems == 0);
}

}  // namespace
}  // namespace wb::delta
