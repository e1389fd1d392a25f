// Maps (part of) a POSIX shared-memory object that a local process created, so the agent can
// read or write the tensor it holds. Unmapped when the last owner lets go.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace wb::local {

class ShmMapping {
 public:
  // Maps [offset, offset + length) of the object `name` read-write. Errors name the object:
  // it does not exist, it is smaller than offset + length, or mapping failed.
  static absl::StatusOr<std::unique_ptr<ShmMapping>> Open(const std::string& name, uint64_t offset,
                                                          uint64_t length);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  void* data() const { return data_; }
  uint64_t length() const { return length_; }
  const std::string& name() const { return name_; }

 private:
  ShmMapping(std::string name, void* base, uint64_t map_length, void* data, uint64_t length)
      : name_(std::move(name)),
        base_(base),
        map_length_(map_length),
        data_(data),
        length_(length) {}

  std::string name_;
  void* base_;
  uint64_t map_length_;
  void* data_;
  uint64_t length_;
};

}  // namespace wb::local
