// The CUDA transforms against the same golden vectors as the CPU test, and byte-for-byte
// against the CPU on larger random inputs. Without a device the cases report
// "skipped: no CUDA device" and only check that the API says why it cannot run.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "daemon/gpu/device_memory.h"
#include "daemon/transform/float_bits.h"
#include "daemon/transform/transform.h"
#include "tests/transform/golden_vectors.h"

namespace wb::transform {
namespace {

bool HaveDevice() {
  absl::Status s = gpu::CudaAvailable();
  if (!s.ok()) WARN("skipped: " << s.message());
  return s.ok();
}

template <typename T>
gpu::DeviceBuffer Upload(const std::vector<T>& host) {
  auto buf = gpu::DeviceBuffer::Allocate(std::max<size_t>(1, host.size() * sizeof(T)));
  REQUIRE(buf.ok());
  REQUIRE(gpu::CopyHostToDevice(buf->data(), host.data(), host.size() * sizeof(T)).ok());
  return std::move(*buf);
}

template <typename T>
std::vector<T> Download(const gpu::DeviceBuffer& buf, size_t n) {
  std::vector<T> host(n);
  REQUIRE(gpu::SynchronizeStream(nullptr).ok());
  REQUIRE(gpu::CopyDeviceToHost(host.data(), buf.data(), n * sizeof(T)).ok());
  return host;
}

// "" when equal; else how many bytes differ and the first few (index, device, host). A plain
// vector == would print megabytes of bytes on a mismatch.
std::string Differences(const std::vector<uint8_t>& device, const std::vector<uint8_t>& host) {
  if (device.size() != host.size()) {
    return "sizes differ: " + std::to_string(device.size()) + " vs " + std::to_string(host.size());
  }
  size_t count = 0;
  std::string first;
  char buf[64];
  for (size_t i = 0; i < device.size(); ++i) {
    if (device[i] == host[i]) continue;
    if (++count <= 8) {
      std::snprintf(buf, sizeof(buf), " [%zu] 0x%02x vs 0x%02x", i, device[i], host[i]);
      first += buf;
    }
  }
  if (count == 0) return "";
  return std::to_string(count) + " of " + std::to_string(device.size()) +
         " bytes differ (device vs host):" + first;
}

gpu::DeviceBuffer Zeros(size_t bytes) { return Upload(std::vector<uint8_t>(bytes, 0)); }

TEST_CASE("without a device the CUDA path says why it cannot run", "[cuda]") {
  if (gpu::CudaAvailable().ok()) return;
  uint16_t src[4] = {};
  uint8_t dst[4];
  float scale;
  TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, 1, 4};
  absl::Status s = ApplyTransformCuda(d, src, dst, &scale);
  CHECK(absl::IsFailedPrecondition(s));
  const std::string msg(s.message());
  INFO(msg);
  CHECK((msg.find("no CUDA device") != std::string::npos ||
         msg.find("built without CUDA") != std::string::npos));
  CHECK(msg.rfind("transform fp8_block bf16 -> f8_e4m3 on CUDA: ", 0) == 0);
}

TEST_CASE("CUDA fp8 block quantisation matches golden blocks", "[cuda][fp8]") {
  if (!HaveDevice()) return;
  for (const auto& g : golden::Fp8Blocks()) {
    INFO(g.what);
    TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, static_cast<uint64_t>(g.rows),
                    static_cast<uint64_t>(g.cols)};
    gpu::DeviceBuffer src = Upload(g.bf16);
    gpu::DeviceBuffer dst = Zeros(g.rows * g.cols);
    gpu::DeviceBuffer scale = Zeros(4);
    REQUIRE(ApplyTransformCuda(d, src.data(), dst.data(), static_cast<float*>(scale.data())).ok());
    CHECK(Differences(Download<uint8_t>(dst, g.rows * g.cols), g.expected) == "");
    CHECK(golden::U(Download<float>(scale, 1)[0]) == golden::U(g.scale));
  }
}

TEST_CASE("CUDA fp8 quantisation of ragged blocks with padded strides", "[cuda][fp8]") {
  if (!HaveDevice()) return;
  const golden::RaggedCase c = golden::MakeRaggedCase();
  // Destination padding 4 keeps rows 2-byte aligned (paired stores), 3 does not.
  for (uint64_t dst_pad : {4, 3}) {
    INFO("destination row padding " << dst_pad);
    const uint64_t src_stride = (c.cols + 6) * 2, dst_stride = c.cols + dst_pad;
    const uint64_t scale_stride = 16;
    std::vector<uint8_t> src(c.rows * src_stride, 0xff);
    for (int r = 0; r < c.rows; ++r) {
      std::memcpy(src.data() + r * src_stride, c.bf16.data() + r * c.cols, c.cols * 2);
    }
    gpu::DeviceBuffer d_src = Upload(src);
    gpu::DeviceBuffer d_dst = Upload(std::vector<uint8_t>(c.rows * dst_stride, 0x5a));
    gpu::DeviceBuffer d_scales = Upload(std::vector<float>(8, -7.0f));
    TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, 130, 260,
                    src_stride,      dst_stride,   scale_stride};
    REQUIRE(ApplyTransformCuda(d, d_src.data(), d_dst.data(), static_cast<float*>(d_scales.data()))
                .ok());
    const std::vector<uint8_t> dst = Download<uint8_t>(d_dst, c.rows * dst_stride);
    const std::vector<float> scales = Download<float>(d_scales, 8);
    for (int r = 0; r < c.rows; ++r) {
      REQUIRE(std::memcmp(dst.data() + r * dst_stride, c.expected.data() + r * c.cols, c.cols) ==
              0);
      REQUIRE(dst[r * dst_stride + c.cols] == 0x5a);
    }
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j) CHECK(scales[i * 4 + j] == c.scales[i * 3 + j]);
      CHECK(scales[i * 4 + 3] == -7.0f);
    }
  }
}

std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> any;
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    // Mostly weights, some arbitrary bit patterns (denormals, NaN, Inf, huge values).
    v[i] = (i % 13 == 0) ? static_cast<uint16_t>(any(rng)) : bits::F32ToBf16(normal(rng));
  }
  return v;
}

TEST_CASE("CUDA fp8 quantisation and dequantisation equal the CPU byte for byte", "[cuda][fp8]") {
  if (!HaveDevice()) return;
  // Ragged in both directions; an even column count takes the paired path, an odd one not.
  for (uint64_t cols : {1100, 1101}) {
    const uint64_t rows = cols == 1100 ? 1000 : 333;
    INFO(rows << " x " << cols);
    const std::vector<uint16_t> src = RandomBf16(rows * cols, static_cast<uint32_t>(cols));
    const uint64_t srows = (rows + 127) / 128, scols = (cols + 127) / 128;
    TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, rows, cols};
    std::vector<uint8_t> cpu(rows * cols);
    std::vector<float> cpu_scales(srows * scols);
    REQUIRE(ApplyTransformCpu(d, src.data(), cpu.data(), cpu_scales.data()).ok());

    gpu::DeviceBuffer d_src = Upload(src);
    gpu::DeviceBuffer d_dst = Zeros(rows * cols);
    gpu::DeviceBuffer d_scales = Zeros(srows * scols * 4);
    REQUIRE(ApplyTransformCuda(d, d_src.data(), d_dst.data(), static_cast<float*>(d_scales.data()))
                .ok());
    CHECK(Differences(Download<uint8_t>(d_dst, rows * cols), cpu) == "");
    const std::vector<float> gpu_scales = Download<float>(d_scales, srows * scols);
    CHECK(std::memcmp(gpu_scales.data(), cpu_scales.data(), srows * scols * 4) == 0);

    for (DType out : {DType::kBF16, DType::kF32}) {
      INFO("dequantise to " << DTypeName(out));
      TransformDesc back{Kind::kFp8BlockDequant, DType::kF8E4M3, out, rows, cols};
      const size_t bytes = rows * cols * ElementSize(out);
      std::vector<uint8_t> cpu_back(bytes);
      REQUIRE(ApplyTransformCpu(back, cpu.data(), cpu_back.data(), cpu_scales.data()).ok());
      gpu::DeviceBuffer d_back = Zeros(bytes);
      REQUIRE(ApplyTransformCuda(back, d_dst.data(), d_back.data(),
                                 static_cast<float*>(d_scales.data()))
                  .ok());
      CHECK(Differences(Download<uint8_t>(d_back, bytes), cpu_back) == "");
    }
  }
}

TEST_CASE("CUDA casts and copies equal the CPU byte for byte", "[cuda][cast]") {
  if (!HaveDevice()) return;
  const uint64_t rows = 300, cols = 517;
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> any;
  std::vector<uint32_t> f32(rows * cols);
  for (auto& x : f32) x = any(rng);
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (DType s : types) {
    // Build the source in dtype s from the random f32 patterns on the CPU.
    std::vector<uint8_t> src(rows * cols * ElementSize(s));
    TransformDesc to_s{s == DType::kF32 ? Kind::kCopy : Kind::kCast, DType::kF32, s, rows, cols};
    REQUIRE(ApplyTransformCpu(to_s, f32.data(), src.data()).ok());
    gpu::DeviceBuffer d_src = Upload(src);
    for (DType t : types) {
      INFO(DTypeName(s) << " -> " << DTypeName(t));
      const uint64_t dst_stride = cols * ElementSize(t) + 12;
      TransformDesc d{s == t ? Kind::kCopy : Kind::kCast, s, t, rows, cols, 0, dst_stride};
      std::vector<uint8_t> cpu(rows * dst_stride, 0x33);
      REQUIRE(ApplyTransformCpu(d, src.data(), cpu.data()).ok());
      gpu::DeviceBuffer d_dst = Upload(std::vector<uint8_t>(rows * dst_stride, 0x33));
      REQUIRE(ApplyTransformCuda(d, d_src.data(), d_dst.data()).ok());
      CHECK(Differences(Download<uint8_t>(d_dst, rows * dst_stride), cpu) == "");
    }
  }
}

TEST_CASE("CUDA fp8: a coalesced op of many tiles with strided scales equals the CPU",
          "[cuda][fp8]") {
  if (!HaveDevice()) return;
  // A row-parallel TP shard of a whole DeepSeek-V3 expert down_proj, scaled down: 1024 x 128
  // read from a 512-column source at column 256 (row stride 1024 bytes), written densely,
  // its 8 block scales one per scale row (stride 4 bytes): the shape of the planner's
  // coalesced ops (tests/transform/transform_cpu_test.cc checks the CPU against per-tile ops).
  const uint64_t rows = 1024, cols = 128, src_cols = 512;
  const std::vector<uint16_t> src = RandomBf16(rows * src_cols, 11);
  TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, rows, cols, src_cols * 2, cols, 4};
  std::vector<uint8_t> cpu(rows * cols);
  std::vector<float> cpu_scales(rows / 128);
  REQUIRE(ApplyTransformCpu(d, src.data() + 256, cpu.data(), cpu_scales.data()).ok());
  gpu::DeviceBuffer d_src = Upload(src);
  gpu::DeviceBuffer d_dst = Zeros(rows * cols);
  gpu::DeviceBuffer d_scales = Zeros(rows / 128 * 4);
  REQUIRE(ApplyTransformCuda(d, static_cast<const uint8_t*>(d_src.data()) + 256 * 2, d_dst.data(),
                             static_cast<float*>(d_scales.data()))
              .ok());
  CHECK(Differences(Download<uint8_t>(d_dst, rows * cols), cpu) == "");
  const std::vector<float> gpu_scales = Download<float>(d_scales, rows / 128);
  CHECK(std::memcmp(gpu_scales.data(), cpu_scales.data(), rows / 128 * 4) == 0);
}

}  // namespace
}  // namespace wb::transform
