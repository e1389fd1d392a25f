// The registered-memory table a software backend (tcp, local) checks remote writes against:
// region id -> (address, length, access, random key). Lookups pin a region so that
// Remove() waits for writes in progress and nothing lands in a region after it is withdrawn.
// A buffer registered once for many tensors is "windowed": only bytes inside the windows
// opened on it (its live tensors) can be pinned, so a withdrawn tensor's bytes are refused
// while its buffer stays registered.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/transport/transport.h"

namespace wb::transport {

// 64 unguessable bits from the kernel's CSPRNG (getrandom, drawn 4 KiB at a time); never 0.
uint64_t RandomU64();

struct RegionInfo {
  uint64_t id = 0;
  uint8_t* addr = nullptr;
  uint64_t length = 0;
  Access access = Access::kSource;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // CUDA device for kCuda
  uint64_t key = 0;
};

class RegionTable {
 private:
  struct Slot;

 public:
  // Keeps a region from being withdrawn while its bytes are read or written.
  class Pin {
   public:
    Pin() = default;
    Pin(Pin&& other) noexcept;
    Pin& operator=(Pin&& other) noexcept;
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    ~Pin();

    // The first byte of the pinned range (region base + offset).
    uint8_t* data() const { return data_; }
    // Where the pinned bytes live: host memory, or device memory on `device()`.
    MemoryKind kind() const { return kind_; }
    int device() const { return device_; }

   private:
    friend class RegionTable;
    Pin(RegionTable* table, Slot* slot, uint64_t epoch, uint8_t* data, MemoryKind kind, int device)
        : table_(table), slot_(slot), epoch_(epoch), data_(data), kind_(kind), device_(device) {}
    void Release();

    RegionTable* table_ = nullptr;
    Slot* slot_ = nullptr;
    uint64_t epoch_ = 0;
    uint8_t* data_ = nullptr;
    MemoryKind kind_ = MemoryKind::kHost;
    int device_ = -1;
  };

  // `transport` names the owner in error messages ("tcp", "local").
  explicit RegionTable(std::string transport);
  ~RegionTable();

  // Adds a region with a fresh id and a fresh random key. A `windowed` region admits pins
  // only inside its open windows (none at first); any other region is one window, whole.
  absl::StatusOr<RegionInfo> Add(const MemoryRef& mem, Access access, bool windowed = false);
  // Withdraws a region: waits until no pinned write is in progress; afterwards every lookup
  // of the id fails.
  absl::Status Remove(uint64_t id);
  // Windows of a windowed region, counted (two tensors may share bytes: replicas, views).
  absl::Status OpenWindow(uint64_t id, uint64_t offset, uint64_t length);
  // Closes a window opened before, then waits until every pin of the region taken before the
  // close is released (later pins were checked against the new windows). Not concurrently
  // with Remove of the same region.
  absl::Status CloseWindow(uint64_t id, uint64_t offset, uint64_t length);

  // For a write arriving from a peer: the region must exist, be a destination, carry `key`,
  // and contain [offset, offset + length).
  absl::StatusOr<Pin> PinRemoteWrite(uint64_t id, uint64_t key, uint64_t offset, uint64_t length);
  // For a local read (the source of a write): the region must exist and contain the range.
  absl::StatusOr<Pin> PinLocal(uint64_t id, uint64_t offset, uint64_t length);

  absl::StatusOr<RegionInfo> Find(uint64_t id) const;
  size_t size() const;

 private:
  // Bytes [start, end) covered by `count` open windows; segments are disjoint.
  struct Segment {
    uint64_t end = 0;
    int count = 0;
  };
  struct Slot {
    RegionInfo info;
    bool windowed = false;
    std::map<uint64_t, Segment> windows;  // by start
    // Pins in progress by the epoch they were taken in; CloseWindow starts a new epoch and
    // waits for the older ones only, so writes into the buffer's other tensors go on.
    uint64_t epoch = 0;
    std::map<uint64_t, int> in_flight;
  };

  absl::StatusOr<Pin> PinLocked(uint64_t id, uint64_t offset, uint64_t length, const char* what)
      /* requires mu_ */;
  void Unpin(Slot* slot, uint64_t epoch);
  static bool Covered(const Slot& slot, uint64_t offset, uint64_t length);
  // Splits the segment that strictly contains `at`, so that a segment starts there.
  static void SplitAt(Slot& slot, uint64_t at);
  const std::string transport_;
  mutable std::mutex mu_;
  std::condition_variable unpinned_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Slot>> slots_;
};

}  // namespace wb::transport
