// CUDA IPC: the client library exports GPU buffers with GetIpcHandle, and the agent opens them
// through IpcMemoryCache, which opens each allocation (the handle names an allocator block)
// once, counts its users and closes it when the last lease goes away.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::gpu {

constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

// Describes `length` bytes at device pointer `ptr` as a CudaIpc message: the handle of the
// allocation containing it, the offset from that allocation's base and the device.
absl::StatusOr<weightbeam::v1::CudaIpc> GetIpcHandle(const void* ptr, size_t length);

// How allocations are opened and closed; the CUDA runtime by default, fakes in tests.
struct IpcOps {
  // Opens the 64-byte handle on `device`; returns the allocation base.
  std::function<absl::StatusOr<void*>(const std::string& handle, int device)> open;
  std::function<absl::Status(void* base, int device)> close;
  // The size of the opened allocation at `base`, as the driver knows it: the agent checks
  // every registered range against it, never trusting the offset and length it was sent.
  std::function<absl::StatusOr<uint64_t>(void* base, int device)> size;
};
IpcOps CudaIpcOps();

class IpcMemoryCache {
 public:
  // An opened range; releases its reference to the allocation on destruction. Move-only.
  // A lease must not outlive the cache that made it.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }

    void* data() const { return data_; }  // allocation base + offset
    uint64_t length() const { return length_; }
    int device() const { return device_; }
    void Release();

   private:
    friend class IpcMemoryCache;
    IpcMemoryCache* cache_ = nullptr;
    std::string key_;
    void* data_ = nullptr;
    uint64_t length_ = 0;
    int device_ = 0;
  };

  explicit IpcMemoryCache(IpcOps ops = CudaIpcOps()) : ops_(std::move(ops)) {}
  ~IpcMemoryCache();  // closes whatever is still open

  // Opens (or reuses) the allocation named by ipc.ipc_handle() on ipc.device(). Refuses a
  // range [offset, offset + length) that does not lie inside that allocation.
  absl::StatusOr<Lease> Open(const weightbeam::v1::CudaIpc& ipc);

  size_t open_allocations() const;

 private:
  struct Entry {
    void* base = nullptr;
    uint64_t size = 0;
    int device = 0;
    int refs = 0;
  };
  void Unref(const std::string& key);

  IpcOps ops_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wb::gpu
