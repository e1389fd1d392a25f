#include "daemon/local_api/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace wb::local {

namespace {

// Opens `name` and checks that `caller` may map it and that it holds [offset, offset + length);
// on success the caller owns *fd and *st describes the object.
absl::Status OpenChecked(const std::string& name, uint64_t offset, uint64_t length,
                         const ShmCaller& caller, int* fd_out, struct stat* st_out) {
  if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory name '", name, "' must start with '/' and contain no other '/'"));
  }
  if (length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory object '", name, "': length is 0"));
  }
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    int err = errno;
    return absl::NotFoundError(
        absl::StrCat("shared-memory object '", name, "' cannot be opened: ", std::strerror(err)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("fstat of '", name, "': ", std::strerror(err)));
  }
  if (auto s = CheckCallerMayMap(name, st, caller); !s.ok()) {
    close(fd);
    return s;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset > size || length > size - offset) {
    close(fd);
    return absl::OutOfRangeError(absl::StrCat("shared-memory object '", name, "' holds ", size,
                                              " bytes, too small for offset ", offset, " + length ",
                                              length));
  }
  *fd_out = fd;
  *st_out = st;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCallerMayMap(const std::string& name, const struct stat& st,
                               const ShmCaller& caller) {
  if (!S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat("shared-memory object '", name, "' is not a regular file"));
  }
  if (caller.uid == 0) return absl::OkStatus();
  mode_t need = S_IROTH | S_IWOTH;
  if (st.st_uid == caller.uid) {
    need = S_IRUSR | S_IWUSR;
  } else if (st.st_gid == caller.gid) {
    need = S_IRGRP | S_IWGRP;
  }
  if ((st.st_mode & need) == need) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("shared-memory object '", name, "' (owner uid ", st.st_uid, ", gid ", st.st_gid,
                   ", mode ", absl::StrFormat("%04o", st.st_mode & 07777),
                   ") may not be read and written by the caller (pid ", caller.pid, ", uid ",
                   caller.uid, ", gid ", caller.gid, ")"));
}

absl::StatusOr<std::unique_ptr<ShmMapping>> ShmMapping::Open(const std::string& name,
                                                             uint64_t offset, uint64_t length,
                                                             const ShmCaller& caller) {
  int fd = -1;
  struct stat st {};
  if (auto s = OpenChecked(name, offset, length, caller, &fd, &st); !s.ok()) return s;
  auto mapping = Map(name, fd, offset, length);
  close(fd);
  return mapping;
}

absl::StatusOr<std::unique_ptr<ShmMapping>> ShmMapping::Map(const std::string& name, int fd,
                                                            uint64_t offset, uint64_t length) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset / page * page;
  const uint64_t map_length = offset - aligned + length;
  void* base = mmap(nullptr, map_length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(aligned));
  int err = errno;
  if (base == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("mmap of '", name, "' (", map_length, " bytes): ", std::strerror(err)));
  }
  void* data = static_cast<char*>(base) + (offset - aligned);
  const int kept = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (kept < 0) {
    err = errno;
    munmap(base, map_length);
    return absl::InternalError(
        absl::StrCat("keeping a descriptor of '", name, "': ", std::strerror(err)));
  }
  return std::unique_ptr<ShmMapping>(
      new ShmMapping(name, kept, offset, base, map_length, data, length));
}

ShmMapping::~ShmMapping() {
  munmap(base_, map_length_);
  close(fd_);
}

absl::Status ShmMapping::CheckBacked(const void* addr, uint64_t length) const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    int err = errno;
    return absl::InternalError(absl::StrCat("fstat of '", name_, "': ", std::strerror(err)));
  }
  const uint64_t end =
      object_offset_ +
      static_cast<uint64_t>(static_cast<const char*>(addr) - static_cast<const char*>(data_)) +
      length;
  if (static_cast<uint64_t>(st.st_size) >= end) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("shared-memory object '", name_, "' was shrunk to ", st.st_size,
                   " bytes after registration (the tensor needs ", end, ")"));
}

absl::StatusOr<ShmCache::View> ShmCache::Open(const std::string& name, uint64_t offset,
                                              uint64_t length, const ShmCaller& caller) {
  if (caller.batch != 0 && length > 0) {
    absl::MutexLock lock(&mu_);
    const Checked& c = checked_;
    if (c.batch == caller.batch && c.name == name && c.pid == caller.pid && c.uid == caller.uid &&
        c.gid == caller.gid && offset <= c.size && length <= c.size - offset) {
      if (std::shared_ptr<ShmMapping> whole = c.mapping.lock();
          whole != nullptr && whole->length() >= offset + length) {
        return View{whole, static_cast<char*>(whole->data()) + offset};
      }
    }
  }
  int fd = -1;
  struct stat st {};
  if (auto s = OpenChecked(name, offset, length, caller, &fd, &st); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  Entry& entry = entries_[name];
  std::shared_ptr<ShmMapping> whole = entry.mapping.lock();
  if (!whole || entry.dev != st.st_dev || entry.ino != st.st_ino ||
      whole->length() < offset + length) {
    auto mapped = ShmMapping::Map(name, fd, 0, static_cast<uint64_t>(st.st_size));
    if (!mapped.ok()) {
      close(fd);
      return mapped.status();
    }
    whole = std::shared_ptr<ShmMapping>(std::move(*mapped));
    entry = {st.st_dev, st.st_ino, whole};
  }
  close(fd);
  if (caller.batch != 0) {
    checked_ = {caller.batch, name,       caller.pid,
                caller.uid,   caller.gid, static_cast<uint64_t>(st.st_size),
                whole};
  }
  return View{whole, static_cast<char*>(whole->data()) + offset};
}

}  // namespace wb::local
