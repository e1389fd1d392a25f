#include "client/weightbeam/shared_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wb::client {

struct SharedBuffer::Impl {
  std::string name;
  void* data = nullptr;
  size_t size = 0;
  ~Impl() {
    if (data != nullptr) munmap(data, size);
    if (!name.empty()) shm_unlink(name.c_str());
  }
};

SharedBuffer::SharedBuffer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SharedBuffer::SharedBuffer(SharedBuffer&&) noexcept = default;
SharedBuffer& SharedBuffer::operator=(SharedBuffer&&) noexcept = default;
SharedBuffer::~SharedBuffer() = default;

absl::StatusOr<SharedBuffer> SharedBuffer::Create(size_t bytes, const std::string& hint) {
  static std::atomic<int> counter{0};
  if (bytes == 0) return absl::InvalidArgumentError("a shared buffer needs at least one byte");
  auto impl = std::make_unique<Impl>();
  impl->name = absl::StrCat("/wb-", getpid(), "-", hint, "-", counter++);
  int fd = shm_open(impl->name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    int err = errno;
    std::string name = impl->name;
    impl->name.clear();
    return absl::InternalError(absl::StrCat("shm_open ", name, ": ", std::strerror(err)));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("sizing ", impl->name, " to ", bytes, " bytes: ", std::strerror(err)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping ", impl->name, ": ", std::strerror(err)));
  }
  impl->data = p;
  impl->size = bytes;
  return SharedBuffer(std::move(impl));
}

void* SharedBuffer::data() const { return impl_->data; }
size_t SharedBuffer::size() const { return impl_->size; }
const std::string& SharedBuffer::shm_name() const { return impl_->name; }

}  // namespace wb::client
