// Host memory the node agent can reach: a POSIX shared-memory object mapped into this process.
// Training loops and inference workers put tensors here and register them with the agent.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace wb::client {

class SharedBuffer {
 public:
  // Creates and maps a new object of `bytes` (zero-filled). The name is unique per process.
  static absl::StatusOr<SharedBuffer> Create(size_t bytes, const std::string& hint = "buf");
  SharedBuffer(SharedBuffer&&) noexcept;
  SharedBuffer& operator=(SharedBuffer&&) noexcept;
  ~SharedBuffer();  // unmaps and unlinks

  void* data() const;
  size_t size() const;
  const std::string& shm_name() const;  // as passed to shm_open, e.g. "/wb-1234-buf-0"

 private:
  struct Impl;
  explicit SharedBuffer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wb::client
