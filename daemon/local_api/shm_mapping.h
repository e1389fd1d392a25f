// Maps (part of) a POSIX shared-memory object that a local process created, so the agent can
// read or write the tensor it holds. Unmapped when the last owner lets go.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace wb::local {

// The process a mapping is made for, from the kernel (SO_PEERCRED).
struct ShmCaller {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  // One registration request's number (0: none). Within one request an object is opened and
  // checked once, at its first tensor; its other tensors are ranges of what was checked then.
  uint64_t batch = 0;
};

// The agent runs as root, so its own open() succeeds on anyone's object: after opening it
// checks that the object is a regular file the caller could open read-write itself by the
// usual owner / group / other mode bits (the caller's primary group only: SO_PEERCRED carries
// no supplementary groups). Root callers may map anything, as they could anyway.
absl::Status CheckCallerMayMap(const std::string& name, const struct stat& st,
                               const ShmCaller& caller);

class ShmMapping {
 public:
  // Maps [offset, offset + length) of the object `name` read-write. Errors name the object:
  // it does not exist, it is smaller than offset + length, or mapping failed.
  static absl::StatusOr<std::unique_ptr<ShmMapping>> Open(const std::string& name, uint64_t offset,
                                                          uint64_t length, const ShmCaller& caller);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  void* data() const { return data_; }
  uint64_t length() const { return length_; }
  const std::string& name() const { return name_; }
  // Whether the object still holds [addr, addr + length) of this mapping (one fstat): its
  // owner may have shrunk it, and touching a page past its end raises SIGBUS.
  absl::Status CheckBacked(const void* addr, uint64_t length) const;

 private:
  friend class ShmCache;
  // Maps [offset, offset + length) of the open object `fd` (not closed here).
  static absl::StatusOr<std::unique_ptr<ShmMapping>> Map(const std::string& name, int fd,
                                                         uint64_t offset, uint64_t length);
  ShmMapping(std::string name, int fd, uint64_t object_offset, void* base, uint64_t map_length,
             void* data, uint64_t length)
      : name_(std::move(name)),
        fd_(fd),
        object_offset_(object_offset),
        base_(base),
        map_length_(map_length),
        data_(data),
        length_(length) {}

  std::string name_;
  int fd_;                  // a duplicate, kept to fstat the object's current size
  uint64_t object_offset_;  // offset of data_ in the object
  void* base_;
  uint64_t map_length_;
  void* data_;
  uint64_t length_;
};

// Maps each shared-memory object once, whole, however many tensors live in it: a process that
// registers 10^6 small tensors at offsets of one buffer costs one mapping, not 10^6 (the
// kernel allows ~65 k per process). An object is reused only while some tensor still holds
// its mapping and only if it is the same object (device and inode) at least as large as needed.
class ShmCache {
 public:
  struct View {
    std::shared_ptr<ShmMapping> mapping;  // keeps the whole object mapped
    void* data = nullptr;                 // the first byte of [offset, offset + length)
  };
  // Same checks and error texts as ShmMapping::Open.
  absl::StatusOr<View> Open(const std::string& name, uint64_t offset, uint64_t length,
                            const ShmCaller& caller);

 private:
  struct Entry {
    dev_t dev = 0;
    ino_t ino = 0;
    std::weak_ptr<ShmMapping> mapping;
  };
  absl::Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // The object last opened and checked for a request (ShmCaller::batch): the request's later
  // tensors in it skip shm_open, fstat and the mode check (three system calls, as long as the
  // rest of a tiny tensor's registration).
  struct Checked {
    uint64_t batch = 0;
    std::string name;
    pid_t pid = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    uint64_t size = 0;
    std::weak_ptr<ShmMapping> mapping;
  };
  Checked checked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wb::local
