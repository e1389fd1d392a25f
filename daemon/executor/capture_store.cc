#include "daemon/executor/capture_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/parallel/parallel_for.h"
#include "daemon/executor/gpu_source.h"
#include "daemon/executor/op_bounds.h"
#include "daemon/gpu/device_memory.h"
#include "daemon/gpu/staging.h"
#include "daemon/registry/bus_guard.h"

namespace wb::executor {

namespace v1 = weightbeam::v1;

namespace {
// Host copies (and the paging-in of fresh capture memory) go in pieces of this size, spread
// over the store's threads.
constexpr uint64_t kCopyChunk = uint64_t{8} << 20;
}  // namespace

// Keeps a slot's captured bytes on one device (or the host) alive for as long as a step (or a
// late completion of one) may read them through a stand-in.
class CaptureMemory : public registry::MemoryHold {
 public:
  std::unique_ptr<uint8_t[]> host;
  gpu::DeviceBuffer device;
  uint64_t size = 0;
  uint8_t* data() const { return host ? host.get() : static_cast<uint8_t*>(device.data()); }
};

std::shared_ptr<const registry::RegisteredTensor> CapturedSources::For(
    const v1::TransferOp& op) const {
  if (op.relay()) return nullptr;
  auto it = regions_.find(op.src_region());
  if (it == regions_.end()) return nullptr;
  const auto& pieces = it->second;
  // The last range starting at or before the op's first byte holds all of it (ranges merged).
  auto after = std::upper_bound(pieces.begin(), pieces.end(), op.src_offset(),
                                [](uint64_t off, const Piece& p) { return off < p.offset; });
  if (after == pieces.begin()) return nullptr;
  const Piece& p = *std::prev(after);
  if (op.src_offset() - p.offset + SourceSpan(op) > p.length) return nullptr;
  return p.stand_in;
}

absl::StatusOr<CaptureLayout> CaptureLayout::ForOps(
    const google::protobuf::RepeatedPtrField<v1::TransferOp>& ops) {
  std::map<uint64_t, std::vector<Range>> spans;
  for (const auto& op : ops) {
    if (op.relay()) continue;  // reads this agent's own destination bytes
    // Bounds against the largest region there could be: the spans below cannot overflow.
    if (auto s = CheckSourceOp(op, uint64_t{1} << 62); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", op.op_id(), " (", op.src_tensor(), "): ", s.message()));
    }
    spans[op.src_region()].push_back({op.src_offset(), SourceSpan(op)});
  }
  CaptureLayout layout;
  for (auto& [region, ranges] : spans) {
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.offset < b.offset; });
    std::vector<Range>& merged = layout.regions[region];
    for (const Range& r : ranges) {
      if (!merged.empty() && r.offset <= merged.back().offset + merged.back().length) {
        Range& last = merged.back();
        last.length = std::max(last.offset + last.length, r.offset + r.length) - last.offset;
      } else {
        merged.push_back(r);
      }
    }
    for (const Range& r : merged) layout.bytes += r.length;
  }
  return layout;
}

absl::StatusOr<uint64_t> CaptureStore::Load(
    const google::protobuf::RepeatedPtrField<v1::TransferOp>& ops, uint64_t max_bytes,
    const std::string& who) {
  auto layout = CaptureLayout::ForOps(ops);
  // The old slots' buffers, kept where the new plan needs one of the same size.
  std::vector<std::shared_ptr<SlotMemory>> old;
  std::shared_ptr<const CaptureLayout> kept;
  size_t count = 0;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    ++generation_;
    generation = generation_;
    for (Slot& slot : slots_) {
      // A capture still running on the old plan ends now; its buffers are its own until then
      // (it may be taking them), so only the other slots' are kept for reuse.
      if (slot.state == State::kCapturing) {
        *slot.stop = true;
        continue;
      }
      old.push_back(std::move(slot.memory));
    }
    slots_.clear();
    layout_.reset();
    {
      absl::MutexLock budget(&budget_mu_);
      max_bytes_ = max_bytes;
    }
    if (!layout.ok()) return layout.status();
    const uint64_t bytes = layout->bytes;
    if (max_bytes == 0) return bytes;  // capture off: ops read the live tensors in place
    if (bytes > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          who, ": one capture of the trainer bytes its ops read needs ", bytes,
          " bytes, over the capture budget capture.max_bytes = ", max_bytes,
          " bytes; raise capture.max_bytes to at least ", bytes, " or set it to 0 (no capture)"));
    }
    count = bytes <= max_bytes / 2 ? 2 : 1;
    slots_.resize(count);
    layout_ = std::make_shared<const CaptureLayout>(std::move(*layout));
    kept = layout_;
  }
  // The slots' memory now, while the plan loads, without the lock; a source that is not there
  // yet (or a device that refuses the memory) is left to the first capture, which names it.
  std::map<uint64_t, std::shared_ptr<const registry::RegisteredTensor>> live;
  std::map<int, uint64_t> need;
  if (!Need(*kept, &live, &need).ok()) return kept->bytes;
  // Old buffers of the sizes needed, by device; the others are released before any new one
  // is taken (the budget holds the new slots, not the old ones too).
  std::map<int, std::vector<std::shared_ptr<CaptureMemory>>> reusable;
  for (auto& memory : old) {
    if (!memory) continue;
    for (auto& [device, m] : *memory) {
      auto it = need.find(device);
      if (m && it != need.end() && m->size == it->second) reusable[device].push_back(std::move(m));
    }
  }
  old.clear();
  for (auto& [device, pool] : reusable) {
    if (pool.size() > count) pool.resize(count);
  }
  std::vector<std::shared_ptr<SlotMemory>> prepared;
  for (size_t i = 0; i < count; ++i) {
    auto memory = std::make_shared<SlotMemory>();
    for (auto& [device, pool] : reusable) {
      if (pool.empty()) continue;
      (*memory)[device] = std::move(pool.back());
      pool.pop_back();
    }
    if (auto s = EnsureMemory(need, memory.get(), std::chrono::steady_clock::now()); !s.ok()) {
      spdlog::warn("{}: capture memory not taken at load: {}", who, std::string(s.message()));
      break;
    }
    prepared.push_back(std::move(memory));
  }
  reusable.clear();
  absl::MutexLock lock(&mu_);
  if (generation != generation_) return kept->bytes;  // another plan meanwhile
  for (size_t i = 0; i < prepared.size() && i < slots_.size(); ++i) {
    if (slots_[i].state == State::kEmpty && slots_[i].memory->empty()) {
      slots_[i].memory = std::move(prepared[i]);
    }
  }
  return kept->bytes;
}

uint64_t CaptureStore::memory_bytes() const {
  absl::MutexLock lock(&budget_mu_);
  return LiveBytes();
}

uint64_t CaptureStore::LiveBytes() const {
  uint64_t bytes = 0;
  auto alive = allocated_.begin();
  for (auto it = allocated_.begin(); it != allocated_.end(); ++it) {
    auto m = it->lock();
    if (!m) continue;
    bytes += m->size;
    if (alive != it) *alive = std::move(*it);
    ++alive;
  }
  allocated_.erase(alive, allocated_.end());
  return bytes;
}

void CaptureStore::Clear(Slot* s) {
  s->state = State::kEmpty;
  s->version = 0;
  s->step_id = 0;
  s->sources.reset();
  s->stop.reset();
}

uint32_t CaptureStore::slots() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(slots_.size());
}

std::string CaptureStore::Describe(const Slot& s) {
  switch (s.state) {
    case State::kEmpty:
      return "empty";
    case State::kCapturing:
      return absl::StrCat("being captured into for version ", s.version);
    case State::kCaptured:
      return absl::StrCat("holding version ", s.version, "'s capture, not yet sent");
    case State::kSending:
      return absl::StrCat("being sent from (version ", s.version, ")");
    case State::kSent:
      return absl::StrCat("holding version ", s.version, "'s capture, sent");
  }
  return "";
}

absl::Status CaptureStore::Need(
    const CaptureLayout& layout,
    std::map<uint64_t, std::shared_ptr<const registry::RegisteredTensor>>* live,
    std::map<int, uint64_t>* need) const {
  for (const auto& [region, ranges] : layout.regions) {
    auto t = registry_->Find(region);
    if (!t) {
      return absl::FailedPreconditionError(
          absl::StrCat("source region ", region, " is gone (its process unregistered or exited)"));
    }
    for (const auto& r : ranges) {
      if (r.offset > t->memory.length || r.length > t->memory.length - r.offset) {
        return absl::OutOfRangeError(absl::StrCat("source tensor '", t->spec.name(),
                                                  "': the plan reads [", r.offset, ", +", r.length,
                                                  ") of ", t->memory.length, " bytes"));
      }
      (*need)[IsDeviceSource(t->memory) ? t->memory.device : -1] += r.length;
    }
    (*live)[region] = std::move(t);
  }
  return absl::OkStatus();
}

absl::Status CaptureStore::EnsureMemory(const std::map<int, uint64_t>& need, SlotMemory* memory,
                                        std::chrono::steady_clock::time_point deadline) const {
  for (const auto& [device, bytes] : need) {
    auto& m = (*memory)[device];
    if (m && m.use_count() == 1 && m->size == bytes) continue;
    m.reset();  // freed (unless a finishing send holds it) before more is taken
    // Within the budget: a send finishing may hold an old buffer a moment longer (its late
    // completions): wait for it, by the deadline.
    for (;;) {
      uint64_t live, budget;
      {
        absl::MutexLock lock(&budget_mu_);
        live = LiveBytes();
        budget = max_bytes_;
      }
      if (budget == 0 || live + bytes <= budget) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "capture memory of ", bytes, " bytes would bring this agent's capture memory to ",
            live + bytes, " bytes, over capture.max_bytes = ", budget,
            " (memory of an earlier capture is still held by a send finishing)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto fresh = std::make_shared<CaptureMemory>();
    fresh->size = bytes;
    if (device >= 0) {
      auto buffer = gpu::DeviceBuffer::Allocate(std::max<uint64_t>(bytes, 1), device);
      if (!buffer.ok()) {
        return absl::Status(buffer.status().code(),
                            absl::StrCat("capture memory of ", bytes, " bytes on cuda:", device,
                                         ": ", buffer.status().message()));
      }
      fresh->device = std::move(*buffer);
    } else {
      fresh->host.reset(new (std::nothrow) uint8_t[std::max<uint64_t>(bytes, 1)]);
      if (!fresh->host) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", bytes, " bytes of capture memory"));
      }
      // Paged in now: a first capture into fresh memory took 2-4x as long as the next ones.
      uint8_t* base = fresh->host.get();
      const uint64_t chunks = (bytes + kCopyChunk - 1) / kCopyChunk;
      ParallelFor(chunks, threads_, [&](uint64_t i) {
        const uint64_t off = i * kCopyChunk;
        std::memset(base + off, 0, std::min(kCopyChunk, bytes - off));
      });
    }
    {
      absl::MutexLock budget(&budget_mu_);
      allocated_.push_back(fresh);
    }
    m = std::move(fresh);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CapturedSources>> CaptureStore::Copy(
    const CaptureLayout& layout, SlotMemory* memory, const std::atomic<bool>& stop,
    std::chrono::steady_clock::time_point deadline) const {
  using Clock = std::chrono::steady_clock;
  auto stopped = [&]() -> absl::Status {
    if (stop) return absl::AbortedError("the step was aborted during the capture");
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError("the capture did not finish before its deadline");
    }
    return absl::OkStatus();
  };
  // The test hook: a capture as long as a large one, stopping as a copy does.
  for (const auto until = Clock::now() + test_delay_; Clock::now() < until;) {
    if (auto s = stopped(); !s.ok()) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The live tensors, checked, and the bytes each device (-1: the host) needs.
  std::map<uint64_t, std::shared_ptr<const registry::RegisteredTensor>> live;
  std::map<int, uint64_t> need;
  if (auto s = Need(layout, &live, &need); !s.ok()) return s;
  if (auto s = EnsureMemory(need, memory, deadline); !s.ok()) return s;
  auto sources = std::make_shared<CapturedSources>();
  struct HostCopy {
    uint8_t* dst;
    const uint8_t* src;
    uint64_t length;
    const std::string* what;
  };
  std::vector<HostCopy> host_copies;
  std::map<uint64_t, std::string> what_of;  // region -> "source tensor 'name'"
  std::map<int, uint64_t> at;               // next free byte per device
  for (const auto& [region, ranges] : layout.regions) {
    const auto& t = live.at(region);
    const std::string what = absl::StrCat("source tensor '", t->spec.name(), "'");
    if (t->hold) {
      if (auto s = t->hold->CheckBacked(t->memory.addr, t->memory.length, what); !s.ok()) return s;
    }
    const bool device = IsDeviceSource(t->memory);
    const std::shared_ptr<CaptureMemory>& m = memory->at(device ? t->memory.device : -1);
    uint64_t& next = at[device ? t->memory.device : -1];
    const auto* src = static_cast<const uint8_t*>(t->memory.addr);
    auto& pieces = sources->regions_[region];
    for (const auto& r : ranges) {
      uint8_t* dst = m->data() + next;
      if (device) {
        if (auto s = stopped(); !s.ok()) return s;
        // Device to device, on the source's own GPU.
        if (auto s = gpu::CopyAnyToAny(dst, src + r.offset, r.length, t->memory.device); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat(what, " on cuda:", t->memory.device,
                                                     ": capture copy: ", s.message()));
        }
      } else {
        // Host copies run together below, in chunks across threads.
        for (uint64_t off = 0; off < r.length; off += kCopyChunk) {
          host_copies.push_back({dst + off, src + r.offset + off,
                                 std::min(kCopyChunk, r.length - off), &what_of[region]});
        }
        what_of[region] = what;
      }
      // A stand-in with the region's offsets: byte `r.offset` of the region is `dst`. Only
      // the range's own bytes are ever read through it (CapturedSources::For).
      auto stand_in = std::make_shared<registry::RegisteredTensor>();
      stand_in->region_id = t->region_id;
      stand_in->session = t->session;
      stand_in->spec = t->spec;
      stand_in->owner = t->owner;
      stand_in->location = t->location;
      stand_in->memory = t->memory;
      stand_in->memory.addr = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(dst) - r.offset);
      stand_in->hold = m;
      pieces.push_back({r.offset, r.length, std::move(stand_in)});
      next += r.length;
    }
  }
  std::vector<char> bus_error(host_copies.size(), 0);
  std::atomic<bool> gave_up{false};
  ParallelFor(host_copies.size(), threads_, [&](uint64_t i) {
    // Between chunks of 8 MiB: an abort or the deadline stops a capture of tens of GB.
    if (gave_up || !stopped().ok()) {
      gave_up = true;
      return;
    }
    const HostCopy& c = host_copies[i];
    bus_error[i] = !registry::RunBusGuarded([&] { std::memcpy(c.dst, c.src, c.length); });
  });
  if (gave_up) {
    if (auto s = stopped(); !s.ok()) return s;
    return absl::AbortedError("the capture was stopped");
  }
  for (size_t i = 0; i < host_copies.size(); ++i) {
    if (!bus_error[i]) continue;
    return absl::FailedPreconditionError(
        absl::StrCat(*host_copies[i].what,
                     ": its memory went away during the capture (SIGBUS: the shared-memory object "
                     "was shrunk after registration)"));
  }
  return std::shared_ptr<const CapturedSources>(std::move(sources));
}

absl::Status CaptureStore::Capture(uint64_t version, uint32_t slot, v1::AgentStepReport* report,
                                   uint64_t step_id,
                                   std::chrono::steady_clock::time_point deadline) {
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<const CaptureLayout> layout;
  std::shared_ptr<SlotMemory> memory;
  std::shared_ptr<std::atomic<bool>> stop;
  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    if (slots_.empty()) {
      return absl::FailedPreconditionError(
          "capture is off on this agent for the loaded plan (capture.max_bytes is 0)");
    }
    if (slot >= slots_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("capture slot ", slot, " does not exist (", slots_.size(), " slot(s))"));
    }
    // A capture of an aborted step is stopping (within one chunk): wait for it, not refuse.
    auto none_stopping = [this, slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return slot >= slots_.size() || slots_[slot].state != State::kCapturing ||
             !slots_[slot].stop || !*slots_[slot].stop;
    };
    auto stopped = [this, slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return slot >= slots_.size() || slots_[slot].state != State::kCapturing;
    };
    if (!none_stopping()) {
      mu_.AwaitWithDeadline(
          absl::Condition(&stopped),
          absl::Now() + absl::FromChrono(std::min(
                            deadline - std::chrono::steady_clock::now(),
                            std::chrono::steady_clock::duration(std::chrono::seconds(10)))));
      if (slot >= slots_.size()) return absl::AbortedError("a new plan was loaded");
    }
    Slot& s = slots_[slot];
    if (s.state == State::kCapturing || s.state == State::kSending) {
      return absl::FailedPreconditionError(absl::StrCat("capture slot ", slot, " is ", Describe(s),
                                                        ": not capturing version ", version,
                                                        " into it"));
    }
    if (s.state == State::kCaptured) {
      // The controller hands a slot out only once the step holding it is over: this capture
      // was never sent (its step failed and the abort was lost, or the controller restarted).
      spdlog::warn(
          "capture slot {} held version {}'s capture, never sent (its step is over); "
          "capturing version {} into it",
          slot, s.version, version);
    }
    s.state = State::kCapturing;
    s.version = version;
    s.step_id = step_id;
    s.stop = stop = std::make_shared<std::atomic<bool>>(false);
    // The old capture goes first (its memory is reused, or freed before more is taken: the
    // budget holds `slots` captures).
    s.sources.reset();
    memory = s.memory;
    layout = layout_;
    generation = generation_;
  }
  auto sources = Copy(*layout, memory.get(), *stop, deadline);
  absl::MutexLock lock(&mu_);
  if (generation != generation_) {
    return absl::AbortedError("a new plan was loaded during the capture");
  }
  Slot& s = slots_[slot];
  if (sources.ok() && *stop)
    sources = absl::AbortedError("the step was aborted during the capture");
  if (!sources.ok()) {
    Clear(&s);
    return sources.status();
  }
  s.state = State::kCaptured;
  s.sources = std::move(*sources);
  s.stop.reset();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report->set_capture_seconds(report->capture_seconds() + seconds);
  report->set_capture_bytes(report->capture_bytes() + layout->bytes);
  spdlog::info("version {}: captured {} bytes into slot {} in {:.3f} s", version, layout->bytes,
               slot, seconds);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CapturedSources>> CaptureStore::BeginSend(uint64_t version,
                                                                               uint32_t slot) {
  absl::MutexLock lock(&mu_);
  if (slot >= slots_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("no capture of version ", version,
                                                      " in slot ", slot, " (", slots_.size(),
                                                      " capture slot(s) for the loaded plan)"));
  }
  Slot& s = slots_[slot];
  if ((s.state != State::kCaptured && s.state != State::kSent) || s.version != version) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no capture of version ", version, " in slot ", slot, ": the slot is ", Describe(s)));
  }
  s.state = State::kSending;
  return s.sources;
}

void CaptureStore::EndSend(uint32_t slot) {
  absl::MutexLock lock(&mu_);
  if (slot < slots_.size() && slots_[slot].state == State::kSending) {
    slots_[slot].state = State::kSent;
  }
}

void CaptureStore::Discard(uint64_t version, uint64_t step_id) {
  absl::MutexLock lock(&mu_);
  for (Slot& s : slots_) {
    const bool of_step =
        step_id != 0 && s.step_id != 0 ? s.step_id == step_id : s.version == version;
    if (!of_step || s.state == State::kEmpty) continue;
    if (s.state == State::kCapturing) {
      *s.stop = true;  // ends discarded (Capture clears the slot)
    } else if (s.state == State::kCaptured || s.state == State::kSent) {
      Clear(&s);
    }
  }
}

}  // namespace wb::executor
