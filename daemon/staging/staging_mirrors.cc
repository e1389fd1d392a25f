#include "daemon/staging/staging_mirrors.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/device_memory.h"
#include "daemon/gpu/staging.h"
#include "daemon/registry/bus_guard.h"

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
  std::optional<uid_t> owner;  // the registering process's user, when known
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

  // The live memory is the part its owner can shrink (the mirror is the agent's own).
  absl::Status CheckBacked(const void* addr, uint64_t length,
                           const std::string& what) const override {
    return live_ ? live_->CheckBacked(addr, length, what) : absl::OkStatus();
  }

 private:
  std::shared_ptr<StagingMirrors::Mirrored> mirror_;
  std::shared_ptr<registry::MemoryHold> live_;
};

// Host to host inside the SIGBUS guard: the live side is its owner's shared-memory object,
// which the owner may shrink at any time. Device copies never run inside the guard (a
// siglongjmp out of the driver would leave its locks held); they are synchronized.
}  // namespace

absl::Status CopyMemory(const transport::MemoryRef& dst, const transport::MemoryRef& src,
                        uint64_t length) {
  if (dst.kind == transport::MemoryKind::kHost && src.kind == transport::MemoryKind::kHost) {
    void* d = dst.addr;
    const void* s = src.addr;
    if (!registry::RunBusGuarded([d, s, length] { std::memcpy(d, s, length); })) {
      return absl::FailedPreconditionError(
          "its memory could not be accessed (SIGBUS: its owner shrank the shared-memory object "
          "under the registered range); re-register it");
    }
    return absl::OkStatus();
  }
  const int device = dst.kind == transport::MemoryKind::kCuda ? dst.device : src.device;
  return gpu::CopyAnyToAny(dst.addr, src.addr, length, device);
}

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
  PruneLocked();
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
    if (caller.known) mirror->owner = caller.uid;
    if (host) {
      const std::string name = absl::StrCat("/", kPrefix, getpid(), "-", ++next_);
      int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("creating staging memory ", name, ": ", std::strerror(errno)));
      }
      // A watcher that swaps by itself reads it, never writes or resizes it: the agent keeps
      // owning it (an owner could chmod and ftruncate it under the swap) and lets the
      // registering process's group read it. Its only write path is the transports'.
      if (caller.known && caller.uid != geteuid() &&
          (fchown(fd, static_cast<uid_t>(-1), caller.gid) != 0 || fchmod(fd, 0640) != 0)) {
        spdlog::warn("staging memory {}: cannot let gid {} read it: {}", name, caller.gid,
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
  if (auto s = live.hold ? live.hold->CheckBacked(live.ref.addr, live.ref.length, "the tensor")
                         : absl::OkStatus();
      !s.ok()) {
    return s;
  }
  if (auto s = CopyMemory(out.ref, live.ref, live.ref.length); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("its first copy into staging: ", s.message()));
  }
  return std::optional<registry::OpenedMemory>(std::move(out));
}

void StagingMirrors::PruneLocked() {
  for (auto it = by_live_.begin(); it != by_live_.end();) {
    it = it->second.expired() ? by_live_.erase(it) : std::next(it);
  }
}

size_t StagingMirrors::tracked() const {
  absl::MutexLock lock(&mu_);
  return by_live_.size();
}

void StagingMirrors::Forget() {
  absl::MutexLock lock(&mu_);
  PruneLocked();
}

std::vector<weightbeam::v1::StagedObject> StagingMirrors::HostObjects(
    std::optional<uid_t> owner) const {
  std::vector<weightbeam::v1::StagedObject> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [addr, weak] : by_live_) {
    auto m = weak.lock();
    if (!m) continue;
    if (m->owner != owner) continue;  // another tenant's objects are not this watcher's
    weightbeam::v1::StagedObject o;
    o.set_shm_name(m->live_shm_name);
    o.set_staging_shm_name(m->shm_name);
    o.set_length(m->length);
    out.push_back(std::move(o));
  }
  return out;
}

namespace {

// The live side still backed (one fstat through its hold), then the guarded copy.
absl::Status CheckLive(const registry::RegisteredTensor& t) {
  if (!t.hold) return absl::OkStatus();
  return t.hold->CheckBacked(t.live.addr, t.live.length,
                             absl::StrCat("tensor '", t.spec.name(), "'"));
}

}  // namespace

absl::Status CopyStagedToLive(const registry::RegisteredTensor& t) {
  if (!t.staged) return absl::OkStatus();
  absl::Status s = CheckLive(t);
  if (s.ok()) s = CopyMemory(t.live, t.memory, t.memory.length);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("swapping tensor '", t.spec.name(),
                                               "' into its live memory: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CopyLiveToStaged(const registry::RegisteredTensor& t) {
  if (!t.staged) return absl::OkStatus();
  absl::Status s = CheckLive(t);
  if (s.ok()) s = CopyMemory(t.memory, t.live, t.memory.length);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("restoring the staging mirror of tensor '",
                                               t.spec.name(), "': ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace wb::staging
