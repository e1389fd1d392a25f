// The tcp transport's GPU path (daemon/transport/tcp/gpu_io.h) against a trickling sender, with
// the staging ring replaced by one over host memory (gpu::LazyStaging takes it), so it runs
// without a device: a WRITE payload bound for GPU memory must be complete by the same
// whole-payload deadline as one bound for host memory, however steadily its bytes trickle in.
#include "daemon/transport/tcp/gpu_io.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace wb::transport::tcp {
namespace {

using Clock = std::chrono::steady_clock;

// "Device" memory that is host memory, staged chunk by chunk as the real ring does.
class HostStaging final : public gpu::DeviceStaging {
 public:
  absl::Status ReadFromDevice(int, const uint8_t* src, uint64_t length,
                              const gpu::ChunkSink& sink) override {
    for (uint64_t off = 0; off < length; off += options_.chunk_bytes) {
      const uint64_t n = std::min<uint64_t>(options_.chunk_bytes, length - off);
      if (auto s = sink(src + off, off, n); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::Status WriteToDevice(int, uint8_t* dst, uint64_t length,
                             const gpu::ChunkSource& source) override {
    std::vector<uint8_t> pinned(options_.chunk_bytes);
    for (uint64_t off = 0; off < length; off += options_.chunk_bytes) {
      const uint64_t n = std::min<uint64_t>(options_.chunk_bytes, length - off);
      if (auto s = source(pinned.data(), off, n); !s.ok()) return s;
      std::memcpy(dst + off, pinned.data(), n);
    }
    return absl::OkStatus();
  }
  const gpu::StagingOptions& options() const override { return options_; }

 private:
  gpu::StagingOptions options_{64 << 10, 2};
};

TEST_CASE("a GPU-bound payload trickling in ends at the whole-payload deadline") {
  // A loopback TCP connection, as between two agents.
  uint16_t port = 0;
  auto listener = net::ListenTcp({"127.0.0.1", 0}, &port);
  REQUIRE(listener.ok());
  auto sender = net::ConnectTcp({"127.0.0.1", port}, std::chrono::seconds(5));
  REQUIRE(sender.ok());
  int fds[2] = {::accept(listener->get(), nullptr, nullptr), sender->get()};
  REQUIRE(fds[0] >= 0);
  // Each receive waits at most 200 ms (the connection's write timeout): a byte every 20 ms
  // never trips it.
  REQUIRE(net::TuneSocket(fds[0], 0, std::chrono::milliseconds(200), std::chrono::milliseconds(200))
              .ok());
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    const char b = 'x';
    for (int i = 0; i < 400 && !stop; ++i) {  // 8 s of one byte every 20 ms
      if (::send(fds[1], &b, 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::shutdown(fds[1], SHUT_WR);
  });
  gpu::LazyStaging staging(std::make_unique<HostStaging>());
  std::vector<uint8_t> device(1 << 20);
  size_t received = 0;
  int error = 0;
  absl::Status staging_error;
  const auto t0 = Clock::now();
  // The whole payload by 500 ms from now, as the receiver gives a WRITE its write timeout.
  const auto outcome =
      RecvDevicePayload(staging, fds[0], 0, device.data(), device.size(),
                        t0 + std::chrono::milliseconds(500), &received, &error, &staging_error);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  trickle.join();
  ::close(fds[0]);
  INFO("returned after " << seconds << " s with " << received << " bytes");
  CHECK(staging_error.ok());
  CHECK(outcome == net::RecvOutcome::kTimedOut);
  CHECK(seconds < 2.0);
  CHECK(received < device.size());
}

}  // namespace
}  // namespace wb::transport::tcp
