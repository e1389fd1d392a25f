// Delta codec throughput on a 7168 x 18432 bf16 buffer (264 MB) with a given fraction of
// elements changed, at random positions ("random") or in runs of 16 consecutive elements at
// random places ("clustered"). One JSON line per case: `encode_gbps` and `apply_gbps` count the
// dense buffer bytes covered per second.
//
//   bazel run -c opt //tests/bench:delta_codec_bench -- [--elems N] [--iters N] [--threads N]
// (encode uses --threads, default all cores; apply is single-threaded)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "daemon/delta/delta_codec.h"
#include "tests/bench/bench_support.h"

namespace wb::delta {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Main(int argc, char** argv) {
  uint64_t elems = 7168ull * 18432;
  int iters = 3;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--elems") elems = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--iters") iters = std::atoi(argv[i + 1]);
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
  }
  const uint64_t bytes = elems * 2;
  std::vector<uint8_t> old(bytes);
  uint64_t s = 0x243f6a8885a308d3ull;
  auto next_rand = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t r = next_rand();
    std::memcpy(old.data() + i, &r, std::min<uint64_t>(8, bytes - i));
  }
  struct Case {
    double fraction;
    bool clustered;
  };
  for (Case c : {Case{0.0, false}, Case{0.001, false}, Case{0.01, false}, Case{0.026, false},
                 Case{0.05, false}, Case{0.026, true}, Case{0.05, true}}) {
    const double fraction = c.fraction;
    std::vector<uint8_t> next = old;
    const uint64_t changes = static_cast<uint64_t>(elems * fraction);
    if (c.clustered) {
      constexpr uint64_t kRun = 16;
      for (uint64_t done = 0; done < changes; done += kRun) {
        const uint64_t start = next_rand() % (elems - kRun);
        for (uint64_t k = 0; k < kRun; ++k) next[(start + k) * 2] ^= 1;
      }
    } else {
      for (uint64_t k = 0; k < changes; ++k) next[(next_rand() % elems) * 2] ^= 1;
    }
    std::vector<uint8_t> shadow(bytes), receiver(bytes);
    double encode = 1e30, apply = 1e30;
    DeltaEncoding enc;
    for (int i = 0; i < iters; ++i) {
      std::memcpy(shadow.data(), old.data(), bytes);
      auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<DeltaEncoding> e = EncodeDelta(absl::MakeSpan(shadow), next, 2, threads);
      encode = std::min(encode, Seconds(t0));
      if (!e.ok() || e->kind != DeltaEncoding::Kind::kPacked) {
        std::fprintf(stderr, "encode failed or went dense at fraction %g\n", fraction);
        return 1;
      }
      enc = *std::move(e);
      std::memcpy(receiver.data(), old.data(), bytes);
      t0 = std::chrono::steady_clock::now();
      if (!ApplyDelta(enc.packed, absl::MakeSpan(receiver)).ok()) return 1;
      apply = std::min(apply, Seconds(t0));
    }
    if (receiver != next) {
      std::fprintf(stderr, "round trip mismatch at fraction %g\n", fraction);
      return 1;
    }
    std::printf(
        "{\"bench\":\"delta_codec\",\"pattern\":\"%s\",\"elem_size\":2,\"threads\":%d,\"elems\":%"
        "llu,\"changed_"
        "fraction\":%g,"
        "\"changed\":%llu,\"packed_bytes\":%zu,\"dense_bytes\":%llu,\"encode_seconds\":%.6f,"
        "\"encode_gbps\":%.3f,\"apply_seconds\":%.6f,\"apply_gbps\":%.3f,%s}\n",
        c.clustered ? "clustered" : "random", threads, static_cast<unsigned long long>(elems),
        fraction, static_cast<unsigned long long>(enc.changed_elems), enc.packed.size(),
        static_cast<unsigned long long>(bytes), encode, bytes / encode / 1e9, apply,
        bytes / apply / 1e9, wb::bench::MachineInfoFields().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace wb::delta

int main(int argc, char** argv) { return wb::delta::Main(argc, argv); }
