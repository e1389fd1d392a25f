// Throughput of the rdma transport on one link, comparable to `ib_write_bw -s MSG`: a sender
// and a receiver transport in this process, `--depth` batches of one MSG-byte write in flight,
// `--iters` batches in all. Prints one JSON line.
//   rdma_write_bench --devices=rxe0 --msg=1048576 --iters=200 --depth=16 --qps=2
//                    [--chunk=BYTES --ack_timeout=14 --busy_poll=MICROSECONDS]
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "daemon/transport/rdma/rdma_transport.h"

using namespace wb::transport;

int main(int argc, char** argv) {
  wb::config::RdmaTransportConfig config;
  config.enabled = true;
  config.devices = {"rxe0"};
  uint64_t msg = 1 << 20;
  int iters = 200, depth = 16;
  rdma::RdmaTuning tuning;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      size_t n = std::strlen(name);
      return arg.compare(0, n, name) == 0 ? argv[i] + n : nullptr;
    };
    bool ok = true;
    if (const char* v = value("--devices=")) {
      config.devices = absl::StrSplit(v, ',');
    } else if (const char* v = value("--msg=")) {
      ok = absl::SimpleAtoi(v, &msg);
    } else if (const char* v = value("--iters=")) {
      ok = absl::SimpleAtoi(v, &iters);
    } else if (const char* v = value("--depth=")) {
      ok = absl::SimpleAtoi(v, &depth);
    } else if (const char* v = value("--qps=")) {
      ok = absl::SimpleAtoi(v, &config.qps_per_peer);
    } else if (const char* v = value("--ack_timeout=")) {
      int t = 0;
      ok = absl::SimpleAtoi(v, &t) && t > 0 && t < 32;
      tuning.ack_timeout = static_cast<uint8_t>(t);
    } else if (const char* v = value("--busy_poll=")) {
      int us = 0;
      ok = absl::SimpleAtoi(v, &us) && us >= 0;
      tuning.busy_poll = std::chrono::microseconds(us);
    } else if (const char* v = value("--chunk=")) {
      ok = absl::SimpleAtoi(v, &config.chunk_bytes);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad argument '%s'\n", argv[i]);
      return 2;
    }
  }
  auto sender = rdma::RdmaTransport::Create(config, tuning);
  auto receiver = rdma::RdmaTransport::Create(config, tuning);
  if (!sender.ok() || !receiver.ok()) {
    std::fprintf(stderr, "%s\n", (!sender.ok() ? sender : receiver).status().ToString().c_str());
    return 1;
  }
  // Like ib_write_bw: every message goes to the same buffer pair.
  std::vector<uint8_t> src(msg, 0x5a), dst(msg, 0);
  auto src_desc = (*sender)->Register({src.data(), src.size()}, Access::kSource);
  auto dst_desc = (*receiver)->Register({dst.data(), dst.size()}, Access::kDestination);
  if (!src_desc.ok() || !dst_desc.ok()) {
    std::fprintf(stderr, "registration failed\n");
    return 1;
  }
  rdma::RdmaTransport* rx = receiver->get();
  auto peer = (*sender)->Connect("bench-sender", "bench-receiver", [rx](const std::string& r) {
    return rx->Accept("bench-sender", r);
  });
  if (!peer.ok() || !(*peer)->AddRemoteRegion(*dst_desc).ok()) {
    std::fprintf(stderr, "connect failed: %s\n", peer.status().ToString().c_str());
    return 1;
  }
  WriteOp op{src_desc->region_id(), 0, dst_desc->region_id(), 0, msg};

  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, completed = 0;
  absl::Status first_error;
  auto start = std::chrono::steady_clock::now();
  for (int posted = 0; posted < iters; ++posted) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight < depth; });
      ++in_flight;
    }
    (*peer)->PostBatch({op}, [&](absl::Status status) {
      std::lock_guard<std::mutex> lock(mu);
      if (!status.ok() && first_error.ok()) first_error = status;
      --in_flight;
      ++completed;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed == iters; });
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!first_error.ok()) {
    std::fprintf(stderr, "%s\n", first_error.ToString().c_str());
    return 1;
  }
  double mb_per_s = static_cast<double>(msg) * iters / seconds / 1e6;
  std::string devices;
  for (const auto& d : config.devices) devices += (devices.empty() ? "" : ",") + d;
  std::printf(
      "{\"bench\":\"rdma_write\",\"devices\":\"%s\",\"msg_bytes\":%llu,\"iters\":%d,\"depth\":%d,"
      "\"qps_per_peer\":%d,\"ack_timeout\":%d,\"busy_poll_us\":%d,\"seconds\":%.3f,\"MB_per_s\":%."
      "2f}\n",
      devices.c_str(), static_cast<unsigned long long>(msg), iters, depth, config.qps_per_peer,
      tuning.ack_timeout, static_cast<int>(tuning.busy_poll.count()), seconds, mb_per_s);
  return 0;
}
