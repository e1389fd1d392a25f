// GPU helpers: the probe never crashes, the IPC cache opens each allocation once and closes it
// after the last lease (with fake open/close, so it runs everywhere), and on a GPU machine the
// device memory round trip and IPC handle export work.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "common/gpu/cuda_ipc.h"
#include "daemon/gpu/cuda_probe.h"
#include "daemon/gpu/device_memory.h"

namespace wb::gpu {
namespace {

TEST_CASE("the probe lists devices or says why there are none", "[gpu]") {
  const GpuProbe probe = ProbeGpus();
  if (probe.gpus.empty()) {
    INFO(probe.unavailable_reason);
    CHECK((probe.unavailable_reason == "built without CUDA" ||
           probe.unavailable_reason.rfind("no CUDA device", 0) == 0));
    CHECK(!CudaAvailable().ok());
  } else {
    CHECK(probe.unavailable_reason.empty());
    for (const auto& g : probe.gpus) {
      CHECK(!g.name().empty());
      CHECK(!g.pci_bus_id().empty());
      CHECK(g.memory_bytes() > 0);
    }
  }
}

struct FakeIpc {
  int opens = 0;
  int closes = 0;
  std::vector<uint8_t> memory = std::vector<uint8_t>(4096);
  IpcOps Ops() {
    IpcOps ops;
    ops.open = [this](const std::string& handle, int device) -> absl::StatusOr<void*> {
      if (handle[0] == 'x') return absl::InternalError("cudaIpcOpenMemHandle: invalid handle");
      ++opens;
      return memory.data() + (handle[0] == 'b' ? 2048 : 0);
    };
    ops.close = [this](void*, int) {
      ++closes;
      return absl::OkStatus();
    };
    ops.size = [this](void* base, int) -> absl::StatusOr<uint64_t> {
      return memory.size() - (static_cast<uint8_t*>(base) - memory.data());
    };
    return ops;
  }
};

weightbeam::v1::CudaIpc Ipc(char tag, uint64_t offset, uint64_t length) {
  weightbeam::v1::CudaIpc ipc;
  ipc.set_ipc_handle(std::string(kIpcHandleBytes, tag));
  ipc.set_offset(offset);
  ipc.set_length(length);
  ipc.set_device(0);
  return ipc;
}

TEST_CASE("the IPC cache opens an allocation once and closes it after the last lease", "[gpu]") {
  FakeIpc fake;
  IpcMemoryCache cache(fake.Ops());
  auto first = cache.Open(Ipc('a', 0, 100));
  auto second = cache.Open(Ipc('a', 256, 100));
  auto other = cache.Open(Ipc('b', 16, 8));
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  REQUIRE(other.ok());
  CHECK(fake.opens == 2);
  CHECK(cache.open_allocations() == 2);
  CHECK(first->data() == fake.memory.data());
  CHECK(second->data() == fake.memory.data() + 256);
  CHECK(other->data() == fake.memory.data() + 2048 + 16);
  CHECK(second->length() == 100);

  first->Release();
  CHECK(fake.closes == 0);
  IpcMemoryCache::Lease moved = std::move(*second);
  second->Release();  // moved-from: no effect
  CHECK(fake.closes == 0);
  moved.Release();
  CHECK(fake.closes == 1);
  CHECK(cache.open_allocations() == 1);
  *other = IpcMemoryCache::Lease();
  CHECK(fake.closes == 2);
  CHECK(cache.open_allocations() == 0);

  auto again = cache.Open(Ipc('a', 0, 1));
  REQUIRE(again.ok());
  CHECK(fake.opens == 3);
}

TEST_CASE("the IPC cache refuses a range outside the allocation", "[gpu][security]") {
  FakeIpc fake;  // allocation 'b' holds 2048 bytes
  IpcMemoryCache cache(fake.Ops());
  auto past_end = cache.Open(Ipc('b', 2000, 100));
  REQUIRE_FALSE(past_end.ok());
  CHECK_THAT(std::string(past_end.status().message()),
             Catch::Contains("[2000, +100) on cuda:0 is outside its allocation of 2048 bytes"));
  CHECK(cache.open_allocations() == 0);  // opened for the check, closed again
  auto wraps = cache.Open(Ipc('b', 16, ~uint64_t{0}));
  CHECK_FALSE(wraps.ok());
  auto inside = cache.Open(Ipc('b', 2040, 8));
  CHECK(inside.ok());
  CHECK_FALSE(cache.Open(Ipc('b', 4096, 1)).ok());
  CHECK(cache.open_allocations() == 1);  // the refusal leaves the live lease's entry alone
}

TEST_CASE("the IPC cache reports bad handles with the device", "[gpu]") {
  FakeIpc fake;
  IpcMemoryCache cache(fake.Ops());
  weightbeam::v1::CudaIpc short_handle = Ipc('a', 0, 1);
  short_handle.set_ipc_handle("abc");
  short_handle.set_device(3);
  CHECK(cache.Open(short_handle).status().message() ==
        "CUDA IPC handle on cuda:3 has 3 bytes, expected 64");
  CHECK(cache.Open(Ipc('x', 0, 1)).status().message() ==
        "opening CUDA IPC handle on cuda:0: cudaIpcOpenMemHandle: invalid handle");
  CHECK(cache.open_allocations() == 0);
}

TEST_CASE("without CUDA the default IPC cache and copies fail clearly", "[gpu]") {
  if (CudaAvailable().ok()) return;
  IpcMemoryCache cache;
  absl::StatusOr<IpcMemoryCache::Lease> lease = cache.Open(Ipc('a', 0, 1));
  REQUIRE(!lease.ok());
  INFO(lease.status().message());
  CHECK(std::string(lease.status().message()).rfind("opening CUDA IPC handle on cuda:0: ", 0) == 0);
  CHECK(!DeviceBuffer::Allocate(16).ok());
}

TEST_CASE("device memory round trip and IPC export of an interior pointer", "[gpu][cuda]") {
  if (absl::Status s = CudaAvailable(); !s.ok()) {
    WARN("skipped: " << s.message());
    return;
  }
  auto buf = DeviceBuffer::Allocate(1 << 20);
  REQUIRE(buf.ok());
  std::vector<uint8_t> in(1 << 20), out(1 << 20);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7);
  REQUIRE(CopyHostToDevice(buf->data(), in.data(), in.size()).ok());
  REQUIRE(CopyDeviceToHost(out.data(), buf->data(), out.size()).ok());
  CHECK(in == out);

  auto ipc = GetIpcHandle(static_cast<uint8_t*>(buf->data()) + 4096, 1000);
  REQUIRE(ipc.ok());
  CHECK(ipc->ipc_handle().size() == kIpcHandleBytes);
  CHECK(ipc->offset() == 4096);
  CHECK(ipc->length() == 1000);
  CHECK(ipc->device() == buf->device());
  CHECK(!GetIpcHandle(static_cast<uint8_t*>(buf->data()) + 4096, 1 << 20).ok());
  CHECK(!GetIpcHandle(in.data(), 16).ok());

  // Another process opens the handle and sees the bytes at the offset.
  std::string hex;
  for (unsigned char c : ipc->ipc_handle()) {
    char b[3];
    std::snprintf(b, sizeof(b), "%02x", c);
    hex += b;
  }
  const std::string cmd = "tests/transform/ipc_open_helper " + hex + " " +
                          std::to_string(ipc->offset()) + " " + std::to_string(ipc->length()) +
                          " " + std::to_string(ipc->device());
  FILE* child = popen(cmd.c_str(), "r");
  REQUIRE(child != nullptr);
  unsigned long long hash = 0;
  size_t open_allocations = 0;
  const int fields = std::fscanf(child, "%llu %zu", &hash, &open_allocations);
  CHECK(pclose(child) == 0);
  REQUIRE(fields == 2);
  uint64_t want = 1469598103934665603ull;
  for (size_t i = 4096; i < 4096 + 1000; ++i) want = (want ^ in[i]) * 1099511628211ull;
  CHECK(hash == want);
  CHECK(open_allocations == 1);  // two leases, one open
}

}  // namespace
}  // namespace wb::gpu
