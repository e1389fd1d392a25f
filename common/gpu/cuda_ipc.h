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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::gpu {

constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

// Describes `length` bytes at device pointer `ptr` as a CudaIpc message: the handle of the
// allocation containing it, the offset from that allocation's base and the device (its
// ordinal here, and its UUID and PCI bus id, which mean the same device in every process).
// Memory that CUDA IPC cannot export (a VMM mapping: PyTorch's expandable segments, vLLM's
// cumem allocator; a stream-ordered pool: cudaMallocAsync) is refused up front with
// FailedPrecondition naming the allocator setting to change (NotIpcCapableMessage).
absl::StatusOr<weightbeam::v1::CudaIpc> GetIpcHandle(const void* ptr, size_t length);

// The refusal for memory that cudaIpcGetMemHandle cannot export. `from_pool`: the pointer
// belongs to a stream-ordered memory pool (cudaMallocAsync); else a VMM (cuMemCreate) mapping.
std::string NotIpcCapableMessage(uintptr_t ptr, int device, bool from_pool);

// Waits until every stream of this process on `device` is idle (cudaDeviceSynchronize with that
// device current; the calling thread's context is put back). What a trainer calls after its
// optimizer step and before the agent may read the step's GPU sources.
absl::Status SynchronizeDevice(int device);

// One device as this process sees it.
struct DeviceIdentity {
  int ordinal = 0;
  std::string uuid;  // 16 raw bytes (cudaDeviceProp.uuid)
  std::string pci_bus_id;
};
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L writes it.
std::string FormatUuid(const std::string& uuid);
// "0000:65:00.0" (lower case, 4-digit domain) from any of CUDA's and nvidia-smi's spellings.
std::string NormalizePciBusId(const std::string& bus_id);

// Which of this process's devices (`local`) the exporter's device is: by UUID, else by PCI bus
// id. Never by the exporter's ordinal when an identity is given (ordinals differ between
// processes); a handle without identity (an old client) is accepted only when this process
// sees one device. NotFound names the device and the devices visible here.
absl::StatusOr<int> ResolveIpcDevice(const weightbeam::v1::CudaIpc& ipc,
                                     const std::vector<DeviceIdentity>& local);

// How allocations are opened and closed; the CUDA runtime by default, fakes in tests.
struct IpcOps {
  // Opens the 64-byte handle on `device`; returns the allocation base.
  std::function<absl::StatusOr<void*>(const std::string& handle, int device)> open;
  std::function<absl::Status(void* base, int device)> close;
  // The size of the opened allocation at `base`, as the driver knows it: the agent checks
  // every registered range against it, never trusting the offset and length it was sent.
  std::function<absl::StatusOr<uint64_t>(void* base, int device)> size;
  // This process's devices (ResolveIpcDevice maps the handle's device onto one of them).
  std::function<absl::StatusOr<std::vector<DeviceIdentity>>()> devices;
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
    // The whole allocation the handle names (its tensors share one transport registration).
    void* allocation_base() const { return base_; }
    uint64_t allocation_size() const { return size_; }
    void Release();

   private:
    friend class IpcMemoryCache;
    IpcMemoryCache* cache_ = nullptr;
    std::string key_;
    void* data_ = nullptr;
    uint64_t length_ = 0;
    int device_ = 0;
    void* base_ = nullptr;
    uint64_t size_ = 0;
  };

  explicit IpcMemoryCache(IpcOps ops = CudaIpcOps()) : ops_(std::move(ops)) {}
  ~IpcMemoryCache();  // closes whatever is still open

  // Opens (or reuses) the allocation named by ipc.ipc_handle() on the device of this process
  // that ipc's identity resolves to (ResolveIpcDevice; the lease's device() is that ordinal).
  // Refuses a range [offset, offset + length) that does not lie inside that allocation.
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
