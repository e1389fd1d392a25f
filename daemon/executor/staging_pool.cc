#include "daemon/executor/staging_pool.h"

#include <spdlog/spdlog.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace wb::executor {

namespace {
// Buffers are rounded up so similar sizes share cached buffers.
uint64_t RoundUp(uint64_t bytes) {
  uint64_t r = 4096;
  while (r < bytes) r <<= 1;
  return r;
}
}  // namespace

StagingLease::StagingLease(StagingLease&& other) noexcept
    : pool_(other.pool_), buffer_(std::move(other.buffer_)) {
  other.buffer_ = nullptr;
}

StagingLease& StagingLease::operator=(StagingLease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = other.pool_;
    buffer_ = std::move(other.buffer_);
    other.buffer_ = nullptr;
  }
  return *this;
}

void StagingLease::Release() {
  if (buffer_) pool_->Release(std::move(buffer_));
  buffer_ = nullptr;
}

StagingPool::StagingPool(uint64_t watermark_bytes, std::vector<transport::Transport*> transports)
    : watermark_(watermark_bytes), transports_(std::move(transports)) {}

StagingPool::~StagingPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [cap, b] : free_) Free(b.get());
  free_.clear();
}

void StagingPool::Free(StagingBuffer* b) {
  for (transport::Transport* t : transports_) {
    auto it = b->transport_regions.find(t->Name());
    if (it != b->transport_regions.end()) (void)t->Deregister(it->second);
  }
  std::free(b->data);
  b->data = nullptr;
}

std::shared_ptr<StagingBuffer> StagingPool::Allocate(uint64_t bytes) {
  auto b = std::make_shared<StagingBuffer>();
  b->capacity = RoundUp(bytes);
  b->data = static_cast<uint8_t*>(std::aligned_alloc(4096, b->capacity));
  if (b->data == nullptr) return nullptr;
  return b;
}

absl::StatusOr<StagingLease> StagingPool::Acquire(uint64_t bytes,
                                                  const std::atomic<bool>* cancelled) {
  std::shared_ptr<StagingBuffer> buffer;
  {
    absl::MutexLock lock(&mu_);
    auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return in_flight_ == 0 || in_flight_ + bytes <= watermark_ || *cancelled;
    };
    while (!fits()) {
      uint64_t seen = poke_;
      auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return fits() || poke_ != seen; };
      mu_.Await(absl::Condition(&changed));
    }
    if (*cancelled) return absl::CancelledError("step cancelled while waiting for staging");
    in_flight_ += bytes;
    peak_ = std::max(peak_, in_flight_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end()) {
      buffer = it->second;
      cached_bytes_ -= buffer->capacity;
      free_.erase(it);
    }
  }
  if (!buffer) {
    buffer = Allocate(bytes);
    if (!buffer) {
      absl::MutexLock lock(&mu_);
      in_flight_ -= bytes;
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of staging memory"));
    }
    for (transport::Transport* t : transports_) {
      auto desc = t->Register({buffer->data, buffer->capacity, transport::MemoryKind::kHost, -1},
                              transport::Access::kSource);
      if (!desc.ok()) {
        Free(buffer.get());
        absl::MutexLock lock(&mu_);
        in_flight_ -= bytes;
        return absl::Status(desc.status().code(),
                            absl::StrCat("registering staging memory with ", t->Name(), ": ",
                                         desc.status().message()));
      }
      buffer->transport_regions[t->Name()] = desc->region_id();
    }
  }
  buffer->used = bytes;
  return StagingLease(this, std::move(buffer));
}

void StagingPool::Release(std::shared_ptr<StagingBuffer> buffer) {
  std::shared_ptr<StagingBuffer> evict;
  absl::MutexLock lock(&mu_);
  in_flight_ -= buffer->used;
  buffer->used = 0;
  // Keep at most two watermarks' worth of idle buffers; free the rest.
  if (cached_bytes_ + buffer->capacity <= 2 * watermark_) {
    cached_bytes_ += buffer->capacity;
    free_.emplace(buffer->capacity, std::move(buffer));
  } else {
    Free(buffer.get());
  }
}

void StagingPool::Poke() {
  absl::MutexLock lock(&mu_);
  ++poke_;
}

uint64_t StagingPool::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

uint64_t StagingPool::peak_in_flight() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

void StagingPool::ResetPeak() {
  absl::MutexLock lock(&mu_);
  peak_ = in_flight_;
}

}  // namespace wb::executor
