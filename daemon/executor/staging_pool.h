// Staging buffers for prepared (transformed) data, registered once with every transport and
// reused. A watermark caps the bytes handed out at a time, so preparation can never run the
// host out of memory; a request larger than the watermark is served alone instead of waiting
// forever. Acquire hands out a StagingLease, which gives the buffer back when it is destroyed.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/transport.h"

namespace wb::executor {

struct StagingBuffer {
  uint8_t* data = nullptr;
  uint64_t capacity = 0;
  uint64_t used = 0;                                  // bytes charged against the watermark
  std::map<std::string, uint64_t> transport_regions;  // transport name -> region id
};

class StagingPool;

// One acquired staging buffer, charged against the pool's watermark until the lease is
// destroyed or Release()d (moving a lease moves the charge). An empty lease holds nothing.
class StagingLease {
 public:
  StagingLease() = default;
  StagingLease(StagingLease&& other) noexcept;
  StagingLease& operator=(StagingLease&& other) noexcept;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease() { Release(); }

  explicit operator bool() const { return buffer_ != nullptr; }
  StagingBuffer* operator->() const { return buffer_.get(); }
  StagingBuffer& operator*() const { return *buffer_; }
  // Gives the buffer back now (the lease is empty afterwards).
  void Release();

 private:
  friend class StagingPool;
  StagingLease(StagingPool* pool, std::shared_ptr<StagingBuffer> buffer)
      : pool_(pool), buffer_(std::move(buffer)) {}

  StagingPool* pool_ = nullptr;
  std::shared_ptr<StagingBuffer> buffer_;
};

class StagingPool {
 public:
  StagingPool(uint64_t watermark_bytes, std::vector<transport::Transport*> transports);
  ~StagingPool();

  // Blocks until `bytes` fit under the watermark (or nothing else is out), then leases a
  // buffer of at least `bytes`, registered with every transport. Fails when `cancelled` turns
  // true while waiting, or when registration fails.
  absl::StatusOr<StagingLease> Acquire(uint64_t bytes, const std::atomic<bool>* cancelled);
  // Wakes waiters so they can see their cancellation flag.
  void Poke();

  uint64_t watermark() const { return watermark_; }
  uint64_t in_flight() const;
  uint64_t peak_in_flight() const;
  void ResetPeak();

 private:
  friend class StagingLease;
  // Takes back a leased buffer (its bytes leave the watermark).
  void Release(std::shared_ptr<StagingBuffer> buffer);
  std::shared_ptr<StagingBuffer> Allocate(uint64_t bytes);
  void Free(StagingBuffer* b);

  const uint64_t watermark_;
  std::vector<transport::Transport*> transports_;
  mutable absl::Mutex mu_;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t poke_ ABSL_GUARDED_BY(mu_) = 0;
  std::multimap<uint64_t, std::shared_ptr<StagingBuffer>> free_ ABSL_GUARDED_BY(mu_);
  uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace wb::executor
