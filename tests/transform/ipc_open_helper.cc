// Child process of gpu_helpers_test: opens a CUDA IPC handle (hex) through IpcMemoryCache,
// copies the range to the host and prints the FNV-1a hash of its bytes. CUDA IPC cannot be
// opened in the process that exported the handle, hence a separate binary.
//
//   ipc_open_helper HANDLE_HEX OFFSET LENGTH DEVICE [DEVICE_UUID_HEX]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/gpu/cuda_ipc.h"
#include "daemon/gpu/device_memory.h"

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: ipc_open_helper HANDLE_HEX OFFSET LENGTH DEVICE [UUID_HEX]\n");
    return 2;
  }
  auto unhex = [](const std::string& hex) {
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      bytes.push_back(static_cast<char>(std::strtoul(hex.substr(i, 2).c_str(), nullptr, 16)));
    }
    return bytes;
  };
  const std::string handle = unhex(argv[1]);
  weightbeam::v1::CudaIpc ipc;
  ipc.set_ipc_handle(handle);
  ipc.set_offset(std::strtoull(argv[2], nullptr, 10));
  ipc.set_length(std::strtoull(argv[3], nullptr, 10));
  ipc.set_device(std::atoi(argv[4]));
  if (argc == 6) ipc.set_device_uuid(unhex(argv[5]));
  wb::gpu::IpcMemoryCache cache;
  auto first = cache.Open(ipc);
  auto second = cache.Open(ipc);  // same allocation: served from the cache
  if (!first.ok() || !second.ok()) {
    std::fprintf(stderr, "open failed: %s\n",
                 std::string((first.ok() ? second.status() : first.status()).message()).c_str());
    return 1;
  }
  std::vector<uint8_t> host(first->length());
  if (!wb::gpu::CopyDeviceToHost(host.data(), first->data(), host.size(), first->device()).ok())
    return 1;
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : host) h = (h ^ b) * 1099511628211ull;
  std::printf("%llu %zu\n", static_cast<unsigned long long>(h), cache.open_allocations());
  return 0;
}
