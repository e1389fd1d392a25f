// receive.mode staged: the agent's staging memory. Every destination tensor gets a mirror that
// remote writes land in (region_registry registers the mirror with the transports); the live
// tensor is written only by the swap, in one local copy. Host destinations are mirrored per
// shared-memory object, in a shared-memory object of the agent's (a swap watcher maps it by
// name); GPU destinations per tensor, in device memory on the same device (CUDA builds only).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/registry/region_registry.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::staging {

class StagingMirrors : public registry::DestinationStager {
 public:
  // `budget_bytes`: receive.staging_max_bytes (0: no limit). Removes mirrors that agents which
  // are no longer running left in /dev/shm.
  explicit StagingMirrors(uint64_t budget_bytes);
  ~StagingMirrors() override;

  absl::StatusOr<std::optional<registry::OpenedMemory>> Mirror(
      const registry::OpenedMemory& live, const registry::Caller& caller) override;

  uint64_t budget_bytes() const { return budget_; }
  // Staging memory held now (every mirror together).
  uint64_t staged_bytes() const;
  // The host mirrors alive now of tensors registered by user `owner`, for KIND_READY: a
  // watcher hears only of its own user's staging objects.
  std::vector<weightbeam::v1::StagedObject> HostObjects(std::optional<uid_t> owner) const;
  // Host mirrors still tracked (those of withdrawn tensors are pruned).
  size_t tracked() const;
  // Prunes the mirrors no tensor holds any more (after a withdrawal).
  void Forget();

  struct Mirrored;  // one mirror buffer (defined in the .cc)

 private:
  const uint64_t budget_;
  std::shared_ptr<std::atomic<uint64_t>> bytes_;  // outlives the mirrors' releases
  mutable absl::Mutex mu_;
  // Host mirrors by live shared-memory mapping, shared by the tensors in it.
  std::map<const void*, std::weak_ptr<Mirrored>> by_live_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

// `length` bytes from `src` to `dst`, either of which may be GPU memory: host to host a memcpy
// inside the bus guard (a shrunk object is an error, never SIGBUS); else CopyAnyToAny,
// synchronized.
absl::Status CopyMemory(const transport::MemoryRef& dst, const transport::MemoryRef& src,
                        uint64_t length);

// The swap of one tensor: its mirror copied into its live memory (a guarded memcpy after a
// backing check for host tensors; device to device, synchronized, for GPU tensors). Errors
// name the tensor; a shrunk live object is an error, never SIGBUS.
absl::Status CopyStagedToLive(const registry::RegisteredTensor& tensor);
// The other way: the mirror made equal to the live tensor again (after an aborted step).
absl::Status CopyLiveToStaged(const registry::RegisteredTensor& tensor);

}  // namespace wb::staging
