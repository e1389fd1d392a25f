// The local transport's copies with GPU memory on a side: host memory is touched only inside
// the SIGBUS guard and the (here fake) CUDA half only outside it, so a shrunk shm object ends
// the write with an error instead of a siglongjmp out of the CUDA driver.
#include "daemon/transport/local/guarded_copy.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/registry/bus_guard.h"

namespace wb::transport::local {
namespace {

// "Device memory" is host memory here; each call that would be a CUDA call records whether it
// ran inside the SIGBUS guard. Chunks of 4 KiB through one staging buffer.
class FakeDevice : public DeviceCopies {
 public:
  absl::Status ToDevice(int device, uint8_t* dst, uint64_t length,
                        const gpu::ChunkSource& source) override {
    last_device = device;
    for (uint64_t off = 0; off < length; off += kChunk) {
      const uint64_t n = std::min(kChunk, length - off);
      Cuda();
      if (auto s = source(staging, off, n); !s.ok()) return s;
      Cuda();  // the copy of the chunk to the device
      std::memcpy(dst + off, staging, n);
    }
    return absl::OkStatus();
  }
  absl::Status FromDevice(int device, const uint8_t* src, uint64_t length,
                          const gpu::ChunkSink& sink) override {
    last_device = device;
    for (uint64_t off = 0; off < length; off += kChunk) {
      const uint64_t n = std::min(kChunk, length - off);
      Cuda();
      std::memcpy(staging, src + off, n);
      if (auto s = sink(staging, off, n); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::Status DeviceToDevice(int device, uint8_t* dst, const uint8_t* src,
                              uint64_t length) override {
    last_device = device;
    Cuda();
    std::memcpy(dst, src, length);
    return absl::OkStatus();
  }

  static constexpr uint64_t kChunk = 4096;
  uint8_t staging[kChunk];
  int cuda_calls = 0;
  int cuda_calls_inside_guard = 0;
  int last_device = -1;

 private:
  void Cuda() {
    ++cuda_calls;
    if (registry::InsideBusGuard()) ++cuda_calls_inside_guard;
  }
};

// A memfd mapping of `size` bytes that the test can shrink under the copy.
struct Shm {
  explicit Shm(size_t size) : size(size) {
    fd = memfd_create("wb-guarded-copy", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, size) == 0);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    data = static_cast<uint8_t*>(p);
  }
  ~Shm() {
    munmap(data, size);
    close(fd);
  }
  void Shrink(size_t to) { REQUIRE(ftruncate(fd, to) == 0); }
  size_t size;
  int fd = -1;
  uint8_t* data = nullptr;
};

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

TEST_CASE("host -> GPU: bytes arrive, and no CUDA call runs inside the SIGBUS guard") {
  const size_t n = 3 * FakeDevice::kChunk + 100;
  Shm host(n);
  const auto want = Pattern(n);
  std::memcpy(host.data, want.data(), n);
  std::vector<uint8_t> device(n);
  FakeDevice gpu;
  const absl::Status s = CopyGuarded({device.data(), MemoryKind::kCuda, 2},
                                     {host.data, MemoryKind::kHost, -1}, n, gpu);
  REQUIRE(s.ok());
  CHECK(device == want);
  CHECK(gpu.last_device == 2);
  CHECK(gpu.cuda_calls == 8);
  CHECK(gpu.cuda_calls_inside_guard == 0);
}

TEST_CASE("host -> GPU from a shrunk shm object: an error, never a crash") {
  const size_t n = 4 * FakeDevice::kChunk;
  Shm host(n);
  host.Shrink(FakeDevice::kChunk);  // chunks 1.. are gone
  std::vector<uint8_t> device(n);
  FakeDevice gpu;
  const absl::Status s = CopyGuarded({device.data(), MemoryKind::kCuda, 0},
                                     {host.data, MemoryKind::kHost, -1}, n, gpu);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(s.message()).find("SIGBUS") != std::string::npos);
  CHECK(gpu.cuda_calls_inside_guard == 0);
}

TEST_CASE("GPU -> host into a shrunk shm object: an error; CUDA outside the guard") {
  const size_t n = 2 * FakeDevice::kChunk + 1;
  const auto want = Pattern(n);
  std::vector<uint8_t> device = want;
  {
    Shm host(n);
    FakeDevice gpu;
    REQUIRE(CopyGuarded({host.data, MemoryKind::kHost, -1}, {device.data(), MemoryKind::kCuda, 1},
                        n, gpu)
                .ok());
    CHECK(std::equal(want.begin(), want.end(), host.data));
    CHECK(gpu.last_device == 1);
    CHECK(gpu.cuda_calls_inside_guard == 0);
  }
  Shm host(n);
  host.Shrink(0);
  FakeDevice gpu;
  const absl::Status s = CopyGuarded({host.data, MemoryKind::kHost, -1},
                                     {device.data(), MemoryKind::kCuda, 1}, n, gpu);
  CHECK(std::string(s.message()).find("SIGBUS") != std::string::npos);
  CHECK(gpu.cuda_calls > 0);
  CHECK(gpu.cuda_calls_inside_guard == 0);
}

TEST_CASE("GPU -> GPU runs with the source's device current, outside the guard") {
  std::vector<uint8_t> a = Pattern(1000), b(1000);
  FakeDevice gpu;
  REQUIRE(CopyGuarded({b.data(), MemoryKind::kCuda, 0}, {a.data(), MemoryKind::kCuda, 3}, 1000, gpu)
              .ok());
  CHECK(a == b);
  CHECK(gpu.last_device == 3);
  CHECK(gpu.cuda_calls == 1);
  CHECK(gpu.cuda_calls_inside_guard == 0);
}

TEST_CASE("host -> host: memmove under the guard, the CUDA half never called") {
  Shm src(8192), dst(8192);
  const auto want = Pattern(8192);
  std::memcpy(src.data, want.data(), 8192);
  FakeDevice gpu;
  REQUIRE(
      CopyGuarded({dst.data, MemoryKind::kHost, -1}, {src.data, MemoryKind::kHost, -1}, 8192, gpu)
          .ok());
  CHECK(std::equal(want.begin(), want.end(), dst.data));
  CHECK(gpu.cuda_calls == 0);
  src.Shrink(0);
  const absl::Status s =
      CopyGuarded({dst.data, MemoryKind::kHost, -1}, {src.data, MemoryKind::kHost, -1}, 8192, gpu);
  CHECK(std::string(s.message()).find("SIGBUS") != std::string::npos);
}

}  // namespace
}  // namespace wb::transport::local
