#include "daemon/staging/staging_mirrors.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/device_memory.h"
#include "daemon/gpu/staging.h"

namespace wb::staging {

namespace {

constexpr char kPrefix[] = "wb-staging-";

// Mirrors of agents that were killed stay in /dev/shm (named by pid): drop those of dead pids.
void RemoveOrphans() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + sizeof(kPrefix) - 1));
    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) shm_unlink(("/" + name).c_str());
  }
  closedir(dir);
}

}  // namespace

// One mirror buffer: a shared-memory object of the agent's (host) or device memory (GPU). It
// keeps the live memory's hold too, so a swap can always reach the live bytes.
struct StagingMirrors::Mirrored {
  std::string shm_name;  // host: the mirror's name ("/wb-staging-<pid>-<n>")
  std::string live_shm_name;
  void* data = nullptr;
  uint64_t length = 0;
  gpu::DeviceBuffer device;  // GPU mirrors
  std::shared_ptr<std::atomic<uint64_t>> bytes;

  ~Mirrored() {
    if (!shm_name.empty()) {
      munmap(data, length);
      shm_unlink(shm_name.c_str());
    }
    bytes->fetch_sub(length);
  }
};

namespace {

// Keeps a tensor's mirror and its live memory alive.
class MirrorHold : public registry::MemoryHold {
 public:
  MirrorHold(std::shared_ptr<StagingMirrors::Mirrored> mirror,
             std::shared_ptr<registry::MemoryHold> live)
      : mirror_(std::move(mirror)), live_(std::move(live)) {}

 private:
  std::shared_ptr<StagingMirrors::Mirrored> mirror_;
  std::shared_ptr<registry::MemoryHold> live_;
};

absl::Status Copy(const transport::MemoryRef& dst, const transport::MemoryRef& src,
                  uint64_t length) {
  if (dst.kind == transport::MemoryKind::kHost && src.kind == transport::MemoryKind::kHost) {
    std::memcpy(dst.addr, src.addr, length);
    return absl::OkStatus();
  }
  const int device = dst.kind == transport::MemoryKind::kCuda ? dst.device : src.device;
  return gpu::CopyAnyToAny(dst.addr, src.addr, length, device);
}

}  // namespace

StagingMirrors::StagingMirrors(uint64_t budget_bytes)
    : budget_(budget_bytes), bytes_(std::make_shared<std::atomic<uint64_t>>(0)) {
  RemoveOrphans();
}

StagingMirrors::~StagingMirrors() = default;

uint64_t StagingMirrors::staged_bytes() const { return bytes_->load(); }

absl::StatusOr<std::optional<registry::OpenedMemory>> StagingMirrors::Mirror(
    const registry::OpenedMemory& live, const registry::Caller& caller) {
  const bool host = live.ref.kind == transport::MemoryKind::kHost;
  // Host tensors share their object's mirror; a GPU tensor gets its own (an allocator block
  // holds much besides the weights).
  const transport::MemoryRef whole = host && live.buffer.addr != nullptr ? live.buffer : live.ref;
  std::shared_ptr<Mirrored> mirror;
  absl::MutexLock lock(&mu_);
  if (host) {
    auto it = by_live_.find(whole.addr);
    if (it != by_live_.end()) mirror = it->second.lock();
    if (mirror && mirror->length != whole.length) mirror.reset();  // remapped meanwhile
  }
  if (!mirror) {
    if (budget_ != 0 && bytes_->load() + whole.length > budget_) return std::nullopt;
    mirror = std::make_shared<Mirrored>();
    mirror->bytes = bytes_;
    mirror->live_shm_name = live.shm_name;
    if (host) {
      const std::string name = absl::StrCat("/", kPrefix, getpid(), "-", ++next_);
      int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("creating staging memory ", name, ": ", std::strerror(errno)));
      }
      // The watcher that swaps by itself reads it: the registering process's user owns it.
      if (caller.known && caller.uid != geteuid() && fchown(fd, caller.uid, caller.gid) != 0) {
        spdlog::warn("staging memory {}: cannot hand it to uid {}: {}", name, caller.uid,
                     std::strerror(errno));
      }
      // Reserved now (tmpfs): a page that /dev/shm cannot back would raise SIGBUS on a write.
      void* data = MAP_FAILED;
      int err = posix_fallocate(fd, 0, static_cast<off_t>(whole.length));
      if (err == 0) {
        data = mmap(nullptr, whole.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (data == MAP_FAILED) err = errno;
      }
      close(fd);
      if (data == MAP_FAILED) {
        shm_unlink(name.c_str());
        return absl::ResourceExhaustedError(absl::StrCat(
            "mapping ", whole.length, " bytes of staging memory ", name, ": ", std::strerror(err)));
      }
      mirror->shm_name = name;
      mirror->data = data;
    } else {
      auto device = gpu::DeviceBuffer::Allocate(whole.length, whole.device);
      if (!device.ok()) return device.status();
      mirror->device = std::move(*device);
      mirror->data = mirror->device.data();
    }
    mirror->length = whole.length;
    bytes_->fetch_add(whole.length);
    if (host) by_live_[whole.addr] = mirror;
  }
  registry::OpenedMemory out;
  const uint64_t offset =
      static_cast<const uint8_t*>(live.ref.addr) - static_cast<const uint8_t*>(whole.addr);
  out.ref = {static_cast<uint8_t*>(mirror->data) + offset, live.ref.length, live.ref.kind,
             live.ref.device};
  if (host) out.buffer = {mirror->data, mirror->length, whole.kind, whole.device};
  out.location = live.location;
  out.shm_name = mirror->shm_name;
  out.hold = std::make_shared<MirrorHold>(mirror, live.hold);
  // The mirror starts equal to the live tensor (a delta step patches what the engine holds).
  if (auto s = Copy(out.ref, live.ref, live.ref.length); !s.ok()) return s;
  return std::optional<registry::OpenedMemory>(std::move(out));
}

std::vector<weightbeam::v1::StagedObject> StagingMirrors::HostObjects() const {
  std::vector<weightbeam::v1::StagedObject> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [addr, weak] : by_live_) {
    auto m = weak.lock();
    if (!m) continue;
    weightbeam::v1::StagedObject o;
    o.set_shm_name(m->live_shm_name);
    o.set_staging_shm_name(m->shm_name);
    o.set_length(m->length);
    out.push_back(std::move(o));
  }
  return out;
}

absl::Status CopyStagedToLive(
    const std::vector<std::shared_ptr<const registry::RegisteredTensor>>& tensors) {
  for (const auto& t : tensors) {
    if (!t->staged) continue;
    if (auto s = Copy(t->live, t->memory, t->memory.length); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("swapping tensor '", t->spec.name(),
                                                 "' into its live memory: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CopyLiveToStaged(
    const std::vector<std::shared_ptr<const registry::RegisteredTensor>>& tensors) {
  for (const auto& t : tensors) {
    if (!t->staged) continue;
    if (auto s = Copy(t->memory, t->live, t->memory.length); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("restoring the staging mirror of tensor '",
                                                 t->spec.name(), "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace wb::staging
