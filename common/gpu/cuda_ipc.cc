// IpcMemoryCache: one open per allocation, reference-counted leases.
#include "common/gpu/cuda_ipc.h"

#include <cctype>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::gpu {

std::string NotIpcCapableMessage(uintptr_t ptr, int device, bool from_pool) {
  char addr[32];
  std::snprintf(addr, sizeof(addr), "0x%llx", static_cast<unsigned long long>(ptr));
  return absl::StrCat(
      "pointer ", addr, " on cuda:", device, " is ",
      from_pool ? "stream-ordered memory (cudaMallocAsync / a CUDA memory pool)"
                : "a virtual-memory (cuMemCreate) mapping",
      ", which CUDA IPC cannot export; allocate the weights with plain cudaMalloc: PyTorch: "
      "PYTORCH_CUDA_ALLOC_CONF without expandable_segments:True and without "
      "backend:cudaMallocAsync; vLLM: sleep mode off (enable_sleep_mode=False, its cumem "
      "allocator); C++: cudaMalloc instead of cudaMallocAsync or cuMemCreate");
}

std::string FormatUuid(const std::string& uuid) {
  if (uuid.size() != 16) return absl::StrCat("(uuid of ", uuid.size(), " bytes)");
  std::string out = "GPU-";
  for (size_t i = 0; i < 16; ++i) {
    char b[3];
    std::snprintf(b, sizeof(b), "%02x", static_cast<unsigned char>(uuid[i]));
    out += b;
    if (i == 3 || i == 5 || i == 7 || i == 9) out += '-';
  }
  return out;
}

std::string NormalizePciBusId(const std::string& bus_id) {
  std::string s;
  for (char c : bus_id) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // domain:bus:device.function; nvidia-smi writes an 8-digit domain, CUDA a 4-digit one.
  const size_t colon = s.find(':');
  if (colon == std::string::npos || s.find(':', colon + 1) == std::string::npos) return s;
  std::string domain = s.substr(0, colon);
  while (domain.size() > 4 && domain[0] == '0') domain.erase(0, 1);
  while (domain.size() < 4) domain.insert(0, "0");
  return domain + s.substr(colon);
}

absl::StatusOr<int> ResolveIpcDevice(const weightbeam::v1::CudaIpc& ipc,
                                     const std::vector<DeviceIdentity>& local) {
  auto visible = [&] {
    std::vector<std::string> names;
    for (const auto& d : local) {
      names.push_back(absl::StrCat("cuda:", d.ordinal, " ", FormatUuid(d.uuid), " (",
                                   NormalizePciBusId(d.pci_bus_id), ")"));
    }
    return names.empty() ? std::string("none") : absl::StrJoin(names, ", ");
  };
  if (!ipc.device_uuid().empty()) {
    if (ipc.device_uuid().size() != 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA IPC device uuid has ", ipc.device_uuid().size(), " bytes, expected 16"));
    }
    for (const auto& d : local) {
      if (d.uuid == ipc.device_uuid()) return d.ordinal;
    }
    return absl::NotFoundError(absl::StrCat(
        "the exporter's device ", FormatUuid(ipc.device_uuid()), " (its cuda:", ipc.device(),
        ") is not visible to this agent (visible here: ", visible(),
        "); give the agent every GPU its clients use (CUDA_VISIBLE_DEVICES, the container's "
        "devices)"));
  }
  if (!ipc.pci_bus_id().empty()) {
    const std::string want = NormalizePciBusId(ipc.pci_bus_id());
    for (const auto& d : local) {
      if (NormalizePciBusId(d.pci_bus_id) == want) return d.ordinal;
    }
    return absl::NotFoundError(absl::StrCat("the exporter's device at PCI ", want,
                                            " (its cuda:", ipc.device(),
                                            ") is not visible to this agent (visible "
                                            "here: ",
                                            visible(), ")"));
  }
  if (local.size() == 1) return local[0].ordinal;
  return absl::InvalidArgumentError(absl::StrCat(
      "the CUDA IPC handle names its device only by the exporter's ordinal cuda:", ipc.device(),
      ", which need not be this agent's cuda:", ipc.device(), " (", local.size(),
      " devices visible here); update the client library (it sends the device's UUID)"));
}

IpcMemoryCache::Lease& IpcMemoryCache::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = std::exchange(other.cache_, nullptr);
    key_ = std::move(other.key_);
    data_ = std::exchange(other.data_, nullptr);
    length_ = std::exchange(other.length_, 0);
    device_ = other.device_;
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void IpcMemoryCache::Lease::Release() {
  if (cache_ == nullptr) return;
  cache_->Unref(key_);
  cache_ = nullptr;
  data_ = nullptr;
  length_ = 0;
}

IpcMemoryCache::~IpcMemoryCache() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : entries_) ops_.close(entry.base, entry.device).IgnoreError();
  entries_.clear();
}

absl::StatusOr<IpcMemoryCache::Lease> IpcMemoryCache::Open(const weightbeam::v1::CudaIpc& ipc) {
  if (ipc.ipc_handle().size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC handle on cuda:", ipc.device(),
                                                   " has ", ipc.ipc_handle().size(),
                                                   " bytes, expected ", kIpcHandleBytes));
  }
  int device = 0;
  {
    auto table = ops_.devices ? ops_.devices()
                              : absl::StatusOr<std::vector<DeviceIdentity>>(
                                    absl::UnimplementedError("no device table"));
    if (!table.ok()) {
      return absl::Status(
          table.status().code(),
          absl::StrCat("CUDA IPC handle of the exporter's cuda:", ipc.device(),
                       ": listing this agent's devices: ", table.status().message()));
    }
    auto resolved = ResolveIpcDevice(ipc, *table);
    if (!resolved.ok()) return resolved.status();
    device = *resolved;
  }
  // The handle names the allocation; the device is part of the key because the same process
  // may open it once per device context.
  std::string key = absl::StrCat(device, ":", ipc.ipc_handle());
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    absl::StatusOr<void*> base = ops_.open(ipc.ipc_handle(), device);
    if (!base.ok()) {
      return absl::Status(
          base.status().code(),
          absl::StrCat("opening CUDA IPC handle on cuda:", device, ": ", base.status().message()));
    }
    absl::StatusOr<uint64_t> size =
        ops_.size ? ops_.size(*base, device) : absl::UnimplementedError("no size query");
    if (!size.ok()) {
      ops_.close(*base, device).IgnoreError();
      return absl::Status(size.status().code(),
                          absl::StrCat("CUDA IPC allocation on cuda:", device,
                                       ": cannot learn its size: ", size.status().message()));
    }
    it = entries_.emplace(key, Entry{*base, *size, device, 0}).first;
  }
  const uint64_t size = it->second.size;
  if (ipc.length() == 0 || ipc.offset() > size || ipc.length() > size - ipc.offset()) {
    if (it->second.refs == 0) {
      ops_.close(it->second.base, it->second.device).IgnoreError();
      entries_.erase(it);
    }
    return absl::OutOfRangeError(absl::StrCat("CUDA IPC range [", ipc.offset(), ", +", ipc.length(),
                                              ") on cuda:", device,
                                              " is outside its allocation of ", size, " bytes"));
  }
  ++it->second.refs;
  Lease lease;
  lease.cache_ = this;
  lease.key_ = std::move(key);
  lease.data_ = static_cast<uint8_t*>(it->second.base) + ipc.offset();
  lease.length_ = ipc.length();
  lease.base_ = it->second.base;
  lease.size_ = size;
  lease.device_ = device;
  return lease;
}

void IpcMemoryCache::Unref(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (--it->second.refs > 0) return;
  ops_.close(it->second.base, it->second.device).IgnoreError();
  entries_.erase(it);
}

size_t IpcMemoryCache::open_allocations() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace wb::gpu
