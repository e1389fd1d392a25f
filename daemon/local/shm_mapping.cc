#include "daemon/local/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wb::local {

absl::StatusOr<std::unique_ptr<ShmMapping>> ShmMapping::Open(const std::string& name,
                                                             uint64_t offset, uint64_t length) {
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
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset > size || length > size - offset) {
    close(fd);
    return absl::OutOfRangeError(absl::StrCat("shared-memory object '", name, "' holds ", size,
                                              " bytes, too small for offset ", offset, " + length ",
                                              length));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset / page * page;
  const uint64_t map_length = offset - aligned + length;
  void* base = mmap(nullptr, map_length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(aligned));
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("mmap of '", name, "' (", map_length, " bytes): ", std::strerror(err)));
  }
  void* data = static_cast<char*>(base) + (offset - aligned);
  return std::unique_ptr<ShmMapping>(new ShmMapping(name, base, map_length, data, length));
}

ShmMapping::~ShmMapping() { munmap(base_, map_length_); }

}  // namespace wb::local
