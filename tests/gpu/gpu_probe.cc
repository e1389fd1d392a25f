// Prints what ./wb gpu-check needs to know before it runs anything: whether this build has
// CUDA, the driver's and the runtime's CUDA versions, and the devices (or why there are none).
// Exit 0 with devices, 3 built without CUDA, 4 no device.
#include <cstdio>
#include <string>

#include "daemon/gpu/cuda_probe.h"
#include "daemon/gpu/device_memory.h"

namespace {

std::string Version(int v) {
  if (v == 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

}  // namespace

int main() {
  const wb::gpu::GpuProbe probe = wb::gpu::ProbeGpus();
  const std::string versions = "versions: driver supports CUDA " +
                               Version(probe.driver_cuda_version) + ", runtime CUDA " +
                               Version(probe.runtime_cuda_version);
  if (probe.gpus.empty()) {
    std::printf("gpus: 0 (%s)\n%s\n", probe.unavailable_reason.c_str(), versions.c_str());
    return probe.unavailable_reason == "built without CUDA" ? 3 : 4;
  }
  std::printf("gpus: %zu\n%s\n", probe.gpus.size(), versions.c_str());
  for (const auto& g : probe.gpus) {
    auto peak = wb::gpu::PeakMemoryBandwidthGbps(g.index());
    std::printf("gpu %d: %s, %llu MiB, peak %.0f GB/s\n", g.index(), g.name().c_str(),
                static_cast<unsigned long long>(g.memory_bytes() >> 20), peak.ok() ? *peak : 0.0);
  }
  return 0;
}
