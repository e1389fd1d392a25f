// The finiteness check's CPU rate (VersionChecks.finite, daemon/checks/finite_check.h): one
// thread scanning a finite buffer (the full pass a clean version costs), per dtype. One JSON
// line per dtype: `gbps` counts the bytes scanned per second (best of --iters).
//
//   bazel run -c opt //tests/bench:finite_bench -- [--mib N] [--iters N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/checks/finite_check.h"
#include "tests/bench/bench_support.h"

namespace v1 = weightbeam::v1;

int main(int argc, char** argv) {
  uint64_t mib = 1024;
  int iters = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--iters") iters = std::atoi(argv[i + 1]);
  }
  const uint64_t bytes = mib << 20;
  std::vector<uint8_t> data(bytes);
  // Finite for every dtype: bytes 0x00..0x3f never make an all-ones exponent or an e4m3fn NaN.
  for (uint64_t i = 0; i < bytes; ++i)
    data[i] = static_cast<uint8_t>(((i * 2654435761u) >> 26) & 0x3f);
  struct Case {
    const char* name;
    v1::DType dtype;
    uint32_t size;
  };
  for (Case c : {Case{"bf16", v1::DTYPE_BF16, 2}, Case{"f16", v1::DTYPE_F16, 2},
                 Case{"f32", v1::DTYPE_F32, 4}, Case{"fp8_e4m3", v1::DTYPE_F8_E4M3, 1}}) {
    double best = 1e30;
    for (int it = 0; it < iters; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto hit = wb::checks::FirstNonFinite(data.data(), bytes / c.size, c.dtype);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (hit) wb::bench::Die(std::string("a finite buffer reported non-finite: ") + c.name);
      best = std::min(best, s);
    }
    std::printf(
        "{\"bench\":\"finite_check\",\"dtype\":\"%s\",\"bytes\":%llu,\"seconds\":%.4f,"
        "\"gbps\":%.2f,%s}\n",
        c.name, static_cast<unsigned long long>(bytes), best, bytes / best / 1e9,
        wb::bench::MachineInfoFields().c_str());
  }
  return 0;
}
