#include "daemon/service/memory_opener.h"

#include "absl/strings/str_cat.h"
#include "common/gpu/cuda_ipc.h"
#include "daemon/gpu/cuda_probe.h"
#include "daemon/local_api/shm_mapping.h"

namespace wb::service {

namespace {

class ShmHold : public registry::MemoryHold {
 public:
  explicit ShmHold(std::shared_ptr<local::ShmMapping> m) : mapping(std::move(m)) {}
  absl::Status CheckBacked(const void* addr, uint64_t length,
                           const std::string& what) const override {
    absl::Status s = mapping->CheckBacked(addr, length);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  std::shared_ptr<local::ShmMapping> mapping;
};

class CudaHold : public registry::MemoryHold {
 public:
  explicit CudaHold(gpu::IpcMemoryCache::Lease l) : lease(std::move(l)) {}
  gpu::IpcMemoryCache::Lease lease;
};

// One cache for the agent's lifetime: an allocator block is opened once however many
// tensors live in it.
gpu::IpcMemoryCache& IpcCache() {
  static auto* cache = new gpu::IpcMemoryCache();
  return *cache;
}

// Likewise for shared memory: one mapping per object, not per tensor.
local::ShmCache& ShmCache() {
  static auto* cache = new local::ShmCache();
  return *cache;
}

}  // namespace

bool GpuMemorySupported(std::string* why_not) {
  static const gpu::GpuProbe probe = gpu::ProbeGpus();
  *why_not = probe.unavailable_reason;
  return probe.unavailable_reason.empty() && !probe.gpus.empty();
}

absl::StatusOr<registry::OpenedMemory> OpenMemory(const weightbeam::v1::MemoryHandle& handle,
                                                  const registry::Caller& caller) {
  registry::OpenedMemory m;
  if (!caller.known) {
    return absl::PermissionDeniedError(
        "the caller's credentials are unknown (not a connection on the Local socket)");
  }
  if (handle.has_host_shm()) {
    const auto& h = handle.host_shm();
    auto view = ShmCache().Open(h.shm_name(), h.offset(), h.length(),
                                {caller.pid, caller.uid, caller.gid, caller.batch});
    if (!view.ok()) return view.status();
    m.ref = {view->data, h.length(), transport::MemoryKind::kHost, -1};
    // The object's one mapping: every tensor in it shares one registration per transport.
    m.buffer = {view->mapping->data(), view->mapping->length(), transport::MemoryKind::kHost, -1};
    m.location = "host";
    m.shm_name = h.shm_name();
    m.hold = std::make_shared<ShmHold>(std::move(view->mapping));
    return m;
  }
  std::string why;
  if (!GpuMemorySupported(&why)) {
    return absl::FailedPreconditionError(
        absl::StrCat("a CUDA IPC handle was given but this agent cannot use GPU memory: ", why));
  }
  auto lease = IpcCache().Open(handle.cuda_ipc());
  if (!lease.ok()) return lease.status();
  m.ref = {lease->data(), lease->length(), transport::MemoryKind::kCuda, lease->device()};
  m.buffer = {lease->allocation_base(), lease->allocation_size(), transport::MemoryKind::kCuda,
              lease->device()};
  m.location = absl::StrCat("cuda:", lease->device());
  m.hold = std::make_shared<CudaHold>(std::move(*lease));
  return m;
}

}  // namespace wb::service
