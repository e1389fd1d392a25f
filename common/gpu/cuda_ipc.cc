// IpcMemoryCache: one open per allocation, reference-counted leases.
#include "common/gpu/cuda_ipc.h"

#include "absl/strings/str_cat.h"

namespace wb::gpu {

IpcMemoryCache::Lease& IpcMemoryCache::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = std::exchange(other.cache_, nullptr);
    key_ = std::move(other.key_);
    data_ = std::exchange(other.data_, nullptr);
    length_ = std::exchange(other.length_, 0);
    device_ = other.device_;
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
  // The handle names the allocation; the device is part of the key because the same process
  // may open it once per device context.
  std::string key = absl::StrCat(ipc.device(), ":", ipc.ipc_handle());
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    absl::StatusOr<void*> base = ops_.open(ipc.ipc_handle(), ipc.device());
    if (!base.ok()) {
      return absl::Status(base.status().code(),
                          absl::StrCat("opening CUDA IPC handle on cuda:", ipc.device(), ": ",
                                       base.status().message()));
    }
    absl::StatusOr<uint64_t> size =
        ops_.size ? ops_.size(*base, ipc.device()) : absl::UnimplementedError("no size query");
    if (!size.ok()) {
      ops_.close(*base, ipc.device()).IgnoreError();
      return absl::Status(size.status().code(),
                          absl::StrCat("CUDA IPC allocation on cuda:", ipc.device(),
                                       ": cannot learn its size: ", size.status().message()));
    }
    it = entries_.emplace(key, Entry{*base, *size, ipc.device(), 0}).first;
  }
  const uint64_t size = it->second.size;
  if (ipc.length() == 0 || ipc.offset() > size || ipc.length() > size - ipc.offset()) {
    if (it->second.refs == 0) {
      ops_.close(it->second.base, it->second.device).IgnoreError();
      entries_.erase(it);
    }
    return absl::OutOfRangeError(absl::StrCat("CUDA IPC range [", ipc.offset(), ", +", ipc.length(),
                                              ") on cuda:", ipc.device(),
                                              " is outside its allocation of ", size, " bytes"));
  }
  ++it->second.refs;
  Lease lease;
  lease.cache_ = this;
  lease.key_ = std::move(key);
  lease.data_ = static_cast<uint8_t*>(it->second.base) + ipc.offset();
  lease.length_ = ipc.length();
  lease.device_ = ipc.device();
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
