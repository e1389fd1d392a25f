// GPU helpers: the probe never crashes, the IPC cache opens each allocation once and closes it
// after the last lease (with fake open/close, so it runs everywhere), and on a GPU machine the
// device memory round trip and IPC handle export work.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/gpu/cuda_ipc.h"
#include "daemon/gpu/cuda_probe.h"
#include "daemon/gpu/device_memory.h"

namespace wb::gpu {
namespace {

std::string Hex(const std::string& bytes) {
  std::string hex;
  for (unsigned char c : bytes) {
    char b[3];
    std::snprintf(b, sizeof(b), "%02x", c);
    hex += b;
  }
  return hex;
}

bool Executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// ipc_open_helper from the runfiles wherever this test runs: under `bazel test` (the runfiles
// tree is the working directory and $TEST_SRCDIR), and started by path from anywhere
// (`./wb gpu-check` runs bazel-bin/tests/transform/gpu_helpers_test from the repository root,
// where tests/transform/ holds only the .cc): <this binary>.runfiles, or its own directory.
std::string IpcOpenHelper() {
  const std::string rel = "weightbeam/tests/transform/ipc_open_helper";
  std::vector<std::string> candidates;
  for (const char* env : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* dir = std::getenv(env); dir != nullptr && *dir != '\0') {
      candidates.push_back(std::string(dir) + "/" + rel);
    }
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    const std::string self(exe, static_cast<size_t>(n));
    candidates.push_back(self + ".runfiles/" + rel);
    candidates.push_back(self.substr(0, self.rfind('/') + 1) + "ipc_open_helper");
  }
  for (const auto& c : candidates) {
    if (Executable(c)) return c;
  }
  return "";
}

TEST_CASE("the IPC open helper is found from the runfiles, whatever the working directory",
          "[gpu]") {
  const std::string before = IpcOpenHelper();
  INFO(before);
  REQUIRE(!before.empty());
  // From another directory (as ./wb gpu-check runs the test) it is still found.
  char cwd[4096];
  REQUIRE(getcwd(cwd, sizeof(cwd)) != nullptr);
  REQUIRE(chdir("/") == 0);
  const std::string after = IpcOpenHelper();
  REQUIRE(chdir(cwd) == 0);
  CHECK(!after.empty());
  CHECK(Executable(after));
}

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

// Two devices as the agent sees them: cuda:0 and cuda:1, each with a UUID and a PCI bus id.
const std::string kUuid0 = std::string(15, '\0') + '\x01';
const std::string kUuid1 = std::string(15, '\0') + '\x02';
std::vector<DeviceIdentity> AgentDevices() {
  return {{0, kUuid0, "0000:17:00.0"}, {1, kUuid1, "0000:65:00.0"}};
}

struct FakeIpc {
  int opens = 0;
  int closes = 0;
  int last_open_device = -1;
  std::vector<uint8_t> memory = std::vector<uint8_t>(4096);
  IpcOps Ops() {
    IpcOps ops;
    ops.devices = [] { return absl::StatusOr<std::vector<DeviceIdentity>>(AgentDevices()); };
    ops.open = [this](const std::string& handle, int device) -> absl::StatusOr<void*> {
      if (handle[0] == 'x') return absl::InternalError("cudaIpcOpenMemHandle: invalid handle");
      last_open_device = device;
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
  ipc.set_device_uuid(kUuid0);
  return ipc;
}

TEST_CASE("the device is resolved by UUID, never by the exporter's ordinal", "[gpu]") {
  weightbeam::v1::CudaIpc ipc = Ipc('a', 0, 1);
  // The exporter saw its GPU as cuda:0 (CUDA_VISIBLE_DEVICES=1): here it is cuda:1.
  ipc.set_device(0);
  ipc.set_device_uuid(kUuid1);
  auto device = ResolveIpcDevice(ipc, AgentDevices());
  REQUIRE(device.ok());
  CHECK(*device == 1);
  // The UUID wins over a PCI bus id that disagrees.
  ipc.set_pci_bus_id("0000:17:00.0");
  CHECK(*ResolveIpcDevice(ipc, AgentDevices()) == 1);

  // The cache opens (and leases) the memory on the resolved device.
  FakeIpc fake;
  IpcMemoryCache cache(fake.Ops());
  auto lease = cache.Open(ipc);
  REQUIRE(lease.ok());
  CHECK(fake.last_open_device == 1);
  CHECK(lease->device() == 1);
}

TEST_CASE("without a UUID the PCI bus id names the device, in any spelling", "[gpu]") {
  weightbeam::v1::CudaIpc ipc = Ipc('a', 0, 1);
  ipc.clear_device_uuid();
  ipc.set_device(7);
  ipc.set_pci_bus_id("00000000:65:00.0");  // nvidia-smi's 8-digit domain
  CHECK(*ResolveIpcDevice(ipc, AgentDevices()) == 1);
  ipc.set_pci_bus_id("0000:17:00.0");
  CHECK(*ResolveIpcDevice(ipc, AgentDevices()) == 0);
  ipc.set_pci_bus_id("0000:B3:00.0");
  auto missing = ResolveIpcDevice(ipc, AgentDevices());
  REQUIRE(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("0000:b3:00.0"));
  CHECK(NormalizePciBusId("00000000:B3:00.0") == "0000:b3:00.0");
}

TEST_CASE("a device the agent cannot see is refused, naming what it can see", "[gpu]") {
  weightbeam::v1::CudaIpc ipc = Ipc('a', 0, 1);
  ipc.set_device_uuid(std::string(16, '\x7f'));
  auto r = ResolveIpcDevice(ipc, AgentDevices());
  REQUIRE(r.status().code() == absl::StatusCode::kNotFound);
  const std::string msg(r.status().message());
  CHECK_THAT(msg, Catch::Contains("GPU-7f7f7f7f-7f7f-7f7f-7f7f-7f7f7f7f7f7f"));
  CHECK_THAT(msg, Catch::Contains("cuda:1 GPU-00000000-0000-0000-0000-000000000002"));
  FakeIpc fake;
  IpcMemoryCache cache(fake.Ops());
  CHECK(cache.Open(ipc).status().code() == absl::StatusCode::kNotFound);
  CHECK(fake.opens == 0);  // never opened on a guessed device
  ipc.set_device_uuid("short");
  CHECK(ResolveIpcDevice(ipc, AgentDevices()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a handle with only an ordinal is accepted only where one device is visible", "[gpu]") {
  weightbeam::v1::CudaIpc ipc = Ipc('a', 0, 1);
  ipc.clear_device_uuid();
  ipc.set_device(3);
  CHECK(ResolveIpcDevice(ipc, AgentDevices()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  const std::vector<DeviceIdentity> one = {{0, kUuid1, "0000:65:00.0"}};
  CHECK(*ResolveIpcDevice(ipc, one) == 0);
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
  CHECK(std::string(lease.status().message())
            .rfind("CUDA IPC handle of the exporter's cuda:0: listing this agent's devices: ", 0) ==
        0);
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
  CHECK(ipc->device_uuid().size() == 16);
  CHECK(!ipc->pci_bus_id().empty());
  // The helper resolves the device from the UUID; the ordinal it gets is deliberately wrong.
  const std::string helper = IpcOpenHelper();
  REQUIRE(!helper.empty());
  // ./wb gpu-check on 2+ GPUs: the child sees the devices in another order.
  const char* visible = std::getenv("WB_TEST_IPC_CHILD_VISIBLE_DEVICES");
  const std::string env =
      visible != nullptr ? std::string("CUDA_VISIBLE_DEVICES=") + visible + " " : "";
  const std::string cmd = env + helper + " " + Hex(ipc->ipc_handle()) + " " +
                          std::to_string(ipc->offset()) + " " + std::to_string(ipc->length()) +
                          " " + std::to_string(ipc->device() + 5) + " " + Hex(ipc->device_uuid());
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
