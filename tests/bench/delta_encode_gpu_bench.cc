// GPU delta encode vs the CPU codec on a BF16 buffer with a given fraction of changed elements,
// shadow on the device and in mapped host memory (one JSON line). GB/s counts the buffer once;
// hbm_pct counts what the device reads (shadow + next) against the device's peak.
//   bazel-bin/tests/bench/delta_encode_gpu_bench --mib=256 --rate=0.01
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "daemon/delta/delta_codec.h"
#include "daemon/delta/gpu_encoder.h"
#include "daemon/gpu/device_memory.h"
#include "tests/bench/bench_support.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("delta_encode_gpu_bench");
  uint64_t mib = 256;
  double rate = 0.01;
  int reps = 5;
  app.add_option("--mib", mib, "buffer size in MiB");
  app.add_option("--rate", rate, "fraction of BF16 elements changed per step");
  app.add_option("--reps", reps, "timed encodes per path (the best one counts)");
  CLI11_PARSE(app, argc, argv);
  const uint64_t bytes = mib << 20;
  std::vector<uint8_t> before(bytes), after;
  std::mt19937_64 rng(1);
  for (auto& b : before) b = static_cast<uint8_t>(rng());
  after = before;
  std::bernoulli_distribution change(rate);
  for (uint64_t i = 0; i < bytes / 2; ++i) {
    if (change(rng)) after[2 * i] ^= 1;
  }
  // CPU reference (one thread), best of reps.
  double cpu_s = 1e9;
  uint64_t packed_bytes = 0;
  for (int r = 0; r < reps; ++r) {
    std::vector<uint8_t> shadow = before;
    const auto t0 = Clock::now();
    auto enc = wb::delta::EncodeDelta(absl::MakeSpan(shadow), after, 2, 1);
    cpu_s = std::min(cpu_s, Seconds(t0));
    if (enc.ok()) packed_bytes = enc->packed.size();
  }
  std::printf(
      "{\"bench\":\"delta_encode_gpu\",\"mib\":%llu,\"rate\":%g,\"packed_bytes\":%llu,"
      "\"cpu_gbps\":%.2f,%s",
      static_cast<unsigned long long>(mib), rate, static_cast<unsigned long long>(packed_bytes),
      bytes / cpu_s / 1e9, wb::bench::MachineInfoFields().c_str());
  if (absl::Status s = wb::delta::GpuEncodeAvailable(); !s.ok()) {
    std::printf(",\"gpu\":\"%s\"}\n", std::string(s.message()).c_str());
    return 0;
  }
  auto peak = wb::gpu::PeakMemoryBandwidthGbps(0);
  auto next = wb::gpu::DeviceBuffer::Allocate(bytes);
  if (!next.ok() || !wb::gpu::CopyHostToDevice(next->data(), after.data(), bytes).ok()) {
    std::printf(",\"error\":\"device buffer\"}\n");
    return 1;
  }
  for (auto placement :
       {wb::delta::ShadowPlacement::kDevice, wb::delta::ShadowPlacement::kHostMapped}) {
    wb::delta::GpuDeltaEncoder encoder(0);
    auto shadow = wb::delta::GpuShadow::Allocate(encoder.device_encoder(), bytes, placement);
    if (!shadow.ok()) {
      std::printf(",\"error\":\"%s\"}\n", std::string(shadow.status().message()).c_str());
      return 1;
    }
    double best = 1e9;
    bool same = true;
    for (int r = 0; r < reps; ++r) {
      if (!encoder.Seed(*shadow, before.data(), bytes).ok()) return 1;
      const auto t0 = Clock::now();
      auto enc = encoder.Encode(*shadow, static_cast<uint8_t*>(next->data()), bytes, 2);
      best = std::min(best, Seconds(t0));
      same = same && enc.ok() && enc->packed.size() == packed_bytes;
    }
    const char* name = placement == wb::delta::ShadowPlacement::kDevice ? "device" : "host";
    std::printf(
        ",\"gpu_%s_shadow_gbps\":%.2f,\"gpu_%s_shadow_hbm_pct\":%.1f,\"gpu_%s_same_size\":%s", name,
        bytes / best / 1e9, name, peak.ok() ? 100.0 * 2 * bytes / best / 1e9 / *peak : 0.0, name,
        same ? "true" : "false");
  }
  std::printf("}\n");
  return 0;
}
