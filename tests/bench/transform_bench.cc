// Throughput of the transforms on a Kimi-K2-sized weight matrix (default 7168 x 18432 bf16):
// fp8 block quantisation, its dequantisation and casts, on the CPU (all threads) and, when a
// CUDA device exists, on the GPU. One JSON line per path; `gbps` counts input bytes, and GPU
// lines add `hbm_fraction` = (input + output bytes) / s over the device's peak bandwidth.
//
//   bazel run -c opt //tests/bench:transform_bench -- [--rows N] [--cols N] [--iters N]
//       [--threads N] [--path fp8_block|fp8_block_dequant_bf16|cast_bf16_f16|...]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "daemon/gpu/device_memory.h"
#include "daemon/transform/float_bits.h"
#include "daemon/transform/transform.h"
#include "tests/bench/bench_support.h"

namespace wb::transform {
namespace {

struct Options {
  uint64_t rows = 7168;
  uint64_t cols = 18432;
  int iters = 3;
  int threads = 0;
  std::string path;  // only this path when set
};

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const uint64_t v = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--rows") o.rows = v;
    if (flag == "--cols") o.cols = v;
    if (flag == "--iters") o.iters = static_cast<int>(v);
    if (flag == "--threads") o.threads = static_cast<int>(v);
    if (flag == "--path") o.path = argv[i + 1];
  }
  return o;
}

// Weight-like bf16 values (|x| ~ 1e-3 .. 1e-1, both signs) from a fast xorshift.
std::vector<uint16_t> MakeWeights(uint64_t n) {
  std::vector<uint16_t> v(n);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const uint16_t sign = (s >> 63) ? 0x8000 : 0;
    const uint16_t exp = static_cast<uint16_t>(117 + (s >> 40) % 7);  // 2^-10 .. 2^-4
    v[i] = static_cast<uint16_t>(sign | (exp << 7) | ((s >> 20) & 0x7f));
  }
  return v;
}

struct Path {
  const char* name;
  TransformDesc desc;
};

std::vector<Path> Paths(const Options& o) {
  std::vector<Path> all = {
      {"fp8_block", {Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, o.rows, o.cols}},
      {"fp8_block_dequant_bf16",
       {Kind::kFp8BlockDequant, DType::kF8E4M3, DType::kBF16, o.rows, o.cols}},
      {"cast_bf16_f16", {Kind::kCast, DType::kBF16, DType::kF16, o.rows, o.cols}},
      {"cast_bf16_f32", {Kind::kCast, DType::kBF16, DType::kF32, o.rows, o.cols}},
      {"cast_f32_bf16", {Kind::kCast, DType::kF32, DType::kBF16, o.rows, o.cols}},
  };
  if (o.path.empty()) return all;
  std::vector<Path> picked;
  for (const Path& p : all) {
    if (o.path == p.name) picked.push_back(p);
  }
  return picked;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Report(const char* device, const char* path, const Options& o, int threads, double seconds,
            uint64_t in_bytes, uint64_t out_bytes, double peak_gbps) {
  std::printf(
      "{\"bench\":\"transform\",\"device\":\"%s\",\"path\":\"%s\",\"rows\":%llu,\"cols\":%llu,"
      "\"threads\":%d,\"seconds\":%.6f,\"gbps\":%.3f",
      device, path, static_cast<unsigned long long>(o.rows),
      static_cast<unsigned long long>(o.cols), threads, seconds, in_bytes / seconds / 1e9);
  if (peak_gbps > 0) {
    std::printf(",\"peak_gbps\":%.1f,\"hbm_fraction\":%.3f", peak_gbps,
                (in_bytes + out_bytes) / seconds / 1e9 / peak_gbps);
  }
  std::printf(",%s}\n", wb::bench::MachineInfoFields().c_str());
  std::fflush(stdout);
}

// Inputs per source dtype, built once: bf16 weights, their fp8 form and scales, f32 form.
struct Inputs {
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> fp8;
  std::vector<float> scales;
  std::vector<float> f32;
  const void* For(DType d) const {
    switch (d) {
      case DType::kBF16:
        return bf16.data();
      case DType::kF8E4M3:
        return fp8.data();
      default:
        return f32.data();
    }
  }
};

void RunCpu(const Options& o, const Inputs& in, int threads) {
  std::vector<uint8_t> out(o.rows * o.cols * 4);
  std::vector<float> scales(in.scales.size());
  for (const Path& p : Paths(o)) {
    float* s = p.desc.kind == Kind::kFp8BlockDequant ? const_cast<float*>(in.scales.data())
                                                     : scales.data();
    double best = 1e30;
    for (int i = 0; i < o.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      if (!ApplyTransformCpu(p.desc, in.For(p.desc.src_dtype), out.data(), s, threads).ok()) {
        std::fprintf(stderr, "cpu %s failed\n", p.name);
        std::exit(1);
      }
      best = std::min(best, Seconds(t0));
    }
    const uint64_t n = o.rows * o.cols;
    Report("cpu", p.name, o, threads, best, n * ElementSize(p.desc.src_dtype),
           n * ElementSize(p.desc.dst_dtype), 0);
  }
}

void RunGpu(const Options& o, const Inputs& in) {
  if (absl::Status s = gpu::CudaAvailable(); !s.ok()) {
    std::fprintf(stderr, "gpu paths skipped: %s\n", std::string(s.message()).c_str());
    return;
  }
  const uint64_t n = o.rows * o.cols;
  auto d_bf16 = gpu::DeviceBuffer::Allocate(n * 2);
  auto d_fp8 = gpu::DeviceBuffer::Allocate(n);
  auto d_f32 = gpu::DeviceBuffer::Allocate(n * 4);
  auto d_out = gpu::DeviceBuffer::Allocate(n * 4);
  auto d_scales = gpu::DeviceBuffer::Allocate(in.scales.size() * 4 + 4);
  if (!d_bf16.ok() || !d_fp8.ok() || !d_f32.ok() || !d_out.ok() || !d_scales.ok()) {
    std::fprintf(stderr, "gpu paths skipped: allocation failed\n");
    return;
  }
  if (!gpu::CopyHostToDevice(d_bf16->data(), in.bf16.data(), n * 2).ok() ||
      !gpu::CopyHostToDevice(d_fp8->data(), in.fp8.data(), n).ok() ||
      !gpu::CopyHostToDevice(d_f32->data(), in.f32.data(), n * 4).ok() ||
      !gpu::CopyHostToDevice(d_scales->data(), in.scales.data(), in.scales.size() * 4).ok()) {
    std::fprintf(stderr, "gpu paths skipped: upload failed\n");
    return;
  }
  const double peak = gpu::PeakMemoryBandwidthGbps(0).value_or(0.0);
  auto* scales = static_cast<float*>(d_scales->data());
  for (const Path& p : Paths(o)) {
    const void* src = p.desc.src_dtype == DType::kBF16     ? d_bf16->data()
                      : p.desc.src_dtype == DType::kF8E4M3 ? d_fp8->data()
                                                           : d_f32->data();
    // Warm up once, then time `reps` back-to-back launches per measurement.
    const int reps = 10;
    if (!ApplyTransformCuda(p.desc, src, d_out->data(), scales).ok() ||
        !gpu::SynchronizeStream(nullptr).ok()) {
      std::fprintf(stderr, "gpu %s failed\n", p.name);
      std::exit(1);
    }
    double best = 1e30;
    for (int i = 0; i < o.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) {
        if (!ApplyTransformCuda(p.desc, src, d_out->data(), scales).ok()) std::exit(1);
      }
      if (!gpu::SynchronizeStream(nullptr).ok()) std::exit(1);
      best = std::min(best, Seconds(t0) / reps);
    }
    Report("cuda:0", p.name, o, 0, best, n * ElementSize(p.desc.src_dtype),
           n * ElementSize(p.desc.dst_dtype), peak);
  }
}

int Main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  const uint64_t n = o.rows * o.cols;
  Inputs in;
  in.bf16 = MakeWeights(n);
  in.fp8.resize(n);
  in.scales.resize(((o.rows + 127) / 128) * ((o.cols + 127) / 128));
  in.f32.resize(n);
  TransformDesc quant{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, o.rows, o.cols};
  TransformDesc widen{Kind::kCast, DType::kBF16, DType::kF32, o.rows, o.cols};
  if (!ApplyTransformCpu(quant, in.bf16.data(), in.fp8.data(), in.scales.data()).ok() ||
      !ApplyTransformCpu(widen, in.bf16.data(), in.f32.data()).ok()) {
    std::fprintf(stderr, "preparing inputs failed\n");
    return 1;
  }
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  RunCpu(o, in, threads);
  RunGpu(o, in);
  return 0;
}

}  // namespace
}  // namespace wb::transform

int main(int argc, char** argv) { return wb::transform::Main(argc, argv); }
