// Applying one packed delta on the receiving agent: the host fast path (ApplyToDestination)
// against the two steps the GPU path uses (ResolveDelta, then ScatterHost or the CUDA scatter),
// on a strided BF16 op (default 4096 x 8192, 64 MiB) with 1% of the elements changed. One JSON
// line; the `gpu_*` fields are null without a CUDA device.
//
//   bazel run //tests/bench:delta_scatter_bench -- [--rows N] [--cols N] [--percent P]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "daemon/delta/delta_codec.h"
#include "daemon/delta/gpu_apply.h"
#include "daemon/delta/op_layout.h"
#include "daemon/gpu/device_memory.h"
#include "tests/bench/bench_support.h"
#include "tests/transform/transfer_ops.h"

namespace wb::delta {
namespace {

namespace v1 = weightbeam::v1;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Main(int argc, char** argv) {
  uint64_t rows = 4096, cols = 8192;
  double percent = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rows") rows = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--cols") cols = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--percent") percent = std::atof(argv[i + 1]);
  }
  const v1::TransferOp op = wb::testing::StridedCopy(v1::DTYPE_BF16, rows, cols, 64, 0);
  const OpLayout layout = LayoutOf(op);
  std::vector<uint8_t> shadow(layout.flat_bytes, 0), next(layout.flat_bytes, 0);
  std::mt19937_64 rng(1);
  const uint64_t elems = layout.flat_bytes / 2;
  const auto changes = static_cast<uint64_t>(elems * percent / 100);
  for (uint64_t i = 0; i < changes; ++i) next[2 * (rng() % elems)] ^= 1;
  auto enc = EncodeDelta(absl::MakeSpan(shadow), next, 2);
  if (!enc.ok() || enc->kind != DeltaEncoding::Kind::kPacked) {
    std::fprintf(stderr, "delta did not pack\n");
    return 1;
  }
  std::vector<uint8_t> dst(rows * (cols + 64) * 2, 0), again(dst.size(), 0);

  auto t0 = std::chrono::steady_clock::now();
  if (!ApplyToDestination(enc->packed, layout, dst.data(), nullptr).ok()) return 1;
  const double apply_s = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  auto list = ResolveDelta(enc->packed, layout);
  if (!list.ok()) return 1;
  const double resolve_s = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  ScatterHost(*list, again.data(), nullptr);
  const double scatter_s = Seconds(t0);
  const bool same = dst == again;

  std::string gpu = "\"gpu_scatter_ms\": null, \"gpu_same\": null";
  if (gpu::CudaAvailable().ok()) {
    auto dev = gpu::DeviceBuffer::Allocate(dst.size());
    std::vector<uint8_t> zeros(dst.size(), 0), back(dst.size());
    if (!dev.ok() || !gpu::CopyHostToDevice(dev->data(), zeros.data(), zeros.size()).ok()) return 1;
    GpuApplier applier;
    const DestinationMemory m{static_cast<uint8_t*>(dev->data()), true, 0};
    if (!applier.Scatter(*list, m, {}, op.dst_tensor()).ok()) return 1;  // warm-up: staging
    if (!gpu::CopyHostToDevice(dev->data(), zeros.data(), zeros.size()).ok()) return 1;
    t0 = std::chrono::steady_clock::now();
    absl::Status s = applier.Scatter(*list, m, {}, op.dst_tensor());
    const double gpu_s = Seconds(t0);
    if (!s.ok() || !gpu::CopyDeviceToHost(back.data(), dev->data(), back.size()).ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 1;
    }
    gpu = "\"gpu_scatter_ms\": " + std::to_string(gpu_s * 1e3) +
          ", \"gpu_same\": " + (back == dst ? "true" : "false");
  }
  std::printf(
      "{\"bench\": \"delta_scatter\", \"dense_mib\": %.1f, \"records\": %llu, "
      "\"apply_ms\": %.3f, \"resolve_ms\": %.3f, \"scatter_host_ms\": %.3f, \"same\": %s, %s, "
      "%s}\n",
      layout.dense_bytes / 1048576.0, static_cast<unsigned long long>(list->data_offsets.size()),
      apply_s * 1e3, resolve_s * 1e3, scatter_s * 1e3, same ? "true" : "false", gpu.c_str(),
      wb::bench::MachineInfoFields().c_str());
  return same ? 0 : 1;
}

}  // namespace
}  // namespace wb::delta

int main(int argc, char** argv) { return wb::delta::Main(argc, argv); }
