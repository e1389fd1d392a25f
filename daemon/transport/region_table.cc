#include "daemon/transport/region_table.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace wb::transport {

uint64_t RandomU64() {
  // Keys come from the kernel's CSPRNG (getrandom), 4 KiB per system call. Not
  // std::random_device: libstdc++ prefers RDRAND/RDSEED, which trap to the hypervisor on some
  // VMs (70 % of an agent's CPU while registering 10^6 tensors, two draws per key).
  static thread_local uint8_t pool[4096];
  static thread_local size_t used = sizeof(pool);
  uint64_t value = 0;
  while (value == 0) {  // 0 never serves as a key
    if (used + sizeof(value) > sizeof(pool)) {
      size_t filled = 0;
      while (filled < sizeof(pool)) {
        ssize_t n = getrandom(pool + filled, sizeof(pool) - filled, 0);
        if (n > 0) {
          filled += static_cast<size_t>(n);
        } else if (n < 0 && errno != EINTR) {
          // No getrandom (pre-3.17 kernel): random_device, slow but unguessable.
          static thread_local std::random_device device;
          for (size_t i = filled; i < sizeof(pool); ++i) pool[i] = static_cast<uint8_t>(device());
          filled = sizeof(pool);
        }
      }
      used = 0;
    }
    std::memcpy(&value, pool + used, sizeof(value));
    used += sizeof(value);
  }
  return value;
}

RegionTable::Pin::Pin(Pin&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)),
      slot_(std::exchange(other.slot_, nullptr)),
      epoch_(other.epoch_),
      data_(std::exchange(other.data_, nullptr)),
      kind_(other.kind_),
      device_(other.device_) {}

RegionTable::Pin& RegionTable::Pin::operator=(Pin&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::exchange(other.table_, nullptr);
    slot_ = std::exchange(other.slot_, nullptr);
    epoch_ = other.epoch_;
    data_ = std::exchange(other.data_, nullptr);
    kind_ = other.kind_;
    device_ = other.device_;
  }
  return *this;
}

RegionTable::Pin::~Pin() { Release(); }

void RegionTable::Pin::Release() {
  if (table_ != nullptr) table_->Unpin(slot_, epoch_);
  table_ = nullptr;
  slot_ = nullptr;
  data_ = nullptr;
}

RegionTable::RegionTable(std::string transport) : transport_(std::move(transport)) {}

RegionTable::~RegionTable() {
  std::unique_lock<std::mutex> lock(mu_);
  unpinned_.wait(lock, [&] {
    for (const auto& [id, slot] : slots_) {
      if (!slot->in_flight.empty()) return false;
    }
    return true;
  });
}

absl::StatusOr<RegionInfo> RegionTable::Add(const MemoryRef& mem, Access access, bool windowed) {
  if (mem.addr == nullptr || mem.length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(transport_, ": cannot register an empty region (addr ",
                     reinterpret_cast<uintptr_t>(mem.addr), ", length ", mem.length, ")"));
  }
  auto slot = std::make_unique<Slot>();
  slot->info.addr = static_cast<uint8_t*>(mem.addr);
  slot->info.length = mem.length;
  slot->info.access = access;
  slot->info.kind = mem.kind;
  slot->info.device = mem.kind == MemoryKind::kCuda ? mem.device : -1;
  slot->info.key = RandomU64();
  slot->windowed = windowed;
  std::lock_guard<std::mutex> lock(mu_);
  slot->info.id = next_id_++;
  RegionInfo info = slot->info;
  slots_.emplace(info.id, std::move(slot));
  return info;
}

absl::Status RegionTable::Remove(uint64_t id) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) {
    return absl::NotFoundError(absl::StrCat(transport_, ": region ", id, " is not registered"));
  }
  // Taking it out of the map first stops new pins; then wait for the ones in progress.
  std::unique_ptr<Slot> slot = std::move(it->second);
  slots_.erase(it);
  unpinned_.wait(lock, [&] { return slot->in_flight.empty(); });
  return absl::OkStatus();
}

void RegionTable::SplitAt(Slot& slot, uint64_t at) {
  auto it = slot.windows.upper_bound(at);
  if (it == slot.windows.begin()) return;
  --it;
  if (it->first == at || it->second.end <= at) return;
  const Segment tail{it->second.end, it->second.count};
  it->second.end = at;
  slot.windows.emplace(at, tail);
}

bool RegionTable::Covered(const Slot& slot, uint64_t offset, uint64_t length) {
  if (!slot.windowed || length == 0) return true;
  auto it = slot.windows.upper_bound(offset);
  if (it == slot.windows.begin()) return false;
  --it;
  uint64_t covered_to = it->second.end;  // segments hold count > 0 only
  const uint64_t end = offset + length;  // bounds were checked: no overflow
  while (covered_to < end) {
    ++it;
    if (it == slot.windows.end() || it->first != covered_to) return false;
    covered_to = it->second.end;
  }
  return covered_to > offset;
}

absl::Status RegionTable::OpenWindow(uint64_t id, uint64_t offset, uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = slots_.find(id);
  if (found == slots_.end()) {
    return absl::NotFoundError(absl::StrCat(transport_, ": region ", id, " is not registered"));
  }
  Slot& slot = *found->second;
  if (!slot.windowed || length == 0 || offset > slot.info.length ||
      length > slot.info.length - offset) {
    return absl::InvalidArgumentError(absl::StrCat(transport_, ": window [", offset, ", +", length,
                                                   ") does not fit buffer region ", id, " (length ",
                                                   slot.info.length, ")"));
  }
  const uint64_t end = offset + length;
  SplitAt(slot, offset);
  SplitAt(slot, end);
  uint64_t cursor = offset;
  for (auto it = slot.windows.lower_bound(offset); it != slot.windows.end() && it->first < end;
       ++it) {
    if (it->first > cursor) slot.windows.emplace(cursor, Segment{it->first, 1});
    ++it->second.count;
    cursor = it->second.end;
  }
  if (cursor < end) slot.windows.emplace(cursor, Segment{end, 1});
  return absl::OkStatus();
}

absl::Status RegionTable::CloseWindow(uint64_t id, uint64_t offset, uint64_t length) {
  std::unique_lock<std::mutex> lock(mu_);
  auto found = slots_.find(id);
  if (found == slots_.end()) {
    return absl::NotFoundError(absl::StrCat(transport_, ": region ", id, " is not registered"));
  }
  Slot* slot = found->second.get();
  if (!slot->windowed || length == 0 || offset > slot->info.length ||
      length > slot->info.length - offset || !Covered(*slot, offset, length)) {
    return absl::InvalidArgumentError(
        absl::StrCat(transport_, ": no open window [", offset, ", +", length, ") in region ", id));
  }
  const uint64_t end = offset + length;
  SplitAt(*slot, offset);
  SplitAt(*slot, end);
  for (auto it = slot->windows.lower_bound(offset); it != slot->windows.end() && it->first < end;) {
    it = --it->second.count == 0 ? slot->windows.erase(it) : std::next(it);
  }
  // Pins taken from now on see the closed window; wait for the ones taken before.
  const uint64_t closed_at = ++slot->epoch;
  unpinned_.wait(
      lock, [&] { return slot->in_flight.empty() || slot->in_flight.begin()->first >= closed_at; });
  return absl::OkStatus();
}

absl::StatusOr<RegionTable::Pin> RegionTable::PinLocked(uint64_t id, uint64_t offset,
                                                        uint64_t length, const char* what) {
  auto it = slots_.find(id);
  if (it == slots_.end()) {
    return absl::NotFoundError(
        absl::StrCat(transport_, ": ", what, " region ", id, " is not registered (or withdrawn)"));
  }
  Slot* slot = it->second.get();
  if (offset > slot->info.length || length > slot->info.length - offset) {
    return absl::OutOfRangeError(absl::StrCat(transport_, ": ", what, " [", offset, ", +", length,
                                              ") is out of bounds of region ", id, " (length ",
                                              slot->info.length, ")"));
  }
  if (!Covered(*slot, offset, length)) {
    return absl::PermissionDeniedError(
        absl::StrCat(transport_, ": ", what, " [", offset, ", +", length, ") of buffer region ", id,
                     " lies outside its registered tensors (withdrawn?); refused"));
  }
  ++slot->in_flight[slot->epoch];
  return Pin(this, slot, slot->epoch, slot->info.addr + offset, slot->info.kind, slot->info.device);
}

absl::StatusOr<RegionTable::Pin> RegionTable::PinRemoteWrite(uint64_t id, uint64_t key,
                                                             uint64_t offset, uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it != slots_.end()) {
    const RegionInfo& info = it->second->info;
    if (info.access != Access::kDestination) {
      return absl::PermissionDeniedError(
          absl::StrCat(transport_, ": region ", id,
                       " is not registered as a destination; remote writes refused"));
    }
    if (info.key != key) {
      return absl::PermissionDeniedError(
          absl::StrCat(transport_, ": wrong key for region ", id, "; remote write refused"));
    }
  }
  return PinLocked(id, offset, length, "remote write into");
}

absl::StatusOr<RegionTable::Pin> RegionTable::PinLocal(uint64_t id, uint64_t offset,
                                                       uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  return PinLocked(id, offset, length, "local");
}

absl::StatusOr<RegionInfo> RegionTable::Find(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) {
    return absl::NotFoundError(absl::StrCat(transport_, ": region ", id, " is not registered"));
  }
  return it->second->info;
}

size_t RegionTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

void RegionTable::Unpin(Slot* slot, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slot->in_flight.find(epoch);
  if (--it->second == 0) {
    slot->in_flight.erase(it);
    unpinned_.notify_all();
  }
}

}  // namespace wb::transport
