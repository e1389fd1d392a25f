#include "daemon/service/memory_opener.h"

#include "absl/strings/str_cat.h"
#include "daemon/local/shm_mapping.h"

namespace wb::service {

namespace {
class ShmHold : public registry::MemoryHold {
 public:
  explicit ShmHold(std::unique_ptr<local::ShmMapping> m) : mapping(std::move(m)) {}
  std::unique_ptr<local::ShmMapping> mapping;
};
}  // namespace

bool GpuMemorySupported(std::string* why_not) {
  *why_not = "built without CUDA";
  return false;
}

absl::StatusOr<registry::OpenedMemory> OpenMemory(const weightbeam::v1::MemoryHandle& handle) {
  if (handle.has_host_shm()) {
    const auto& h = handle.host_shm();
    auto mapping = local::ShmMapping::Open(h.shm_name(), h.offset(), h.length());
    if (!mapping.ok()) return mapping.status();
    registry::OpenedMemory m;
    m.ref = {(*mapping)->data(), h.length(), transport::MemoryKind::kHost, -1};
    m.location = "host";
    m.hold = std::make_shared<ShmHold>(std::move(*mapping));
    return m;
  }
  std::string why;
  if (!GpuMemorySupported(&why)) {
    return absl::FailedPreconditionError(
        absl::StrCat("a CUDA IPC handle was given but this agent cannot use GPU memory: ", why));
  }
  return absl::UnimplementedError("CUDA IPC registration");
}

}  // namespace wb::service
