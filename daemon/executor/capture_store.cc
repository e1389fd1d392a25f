#include "daemon/executor/capture_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

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
  absl::MutexLock lock(&mu_);
  ++generation_;
  slots_.clear();
  layout_.reset();
  if (!layout.ok()) return layout.status();
  const uint64_t bytes = layout->bytes;
  if (max_bytes == 0) return bytes;  // capture off: ops read the live tensors in place
  if (bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": one capture of the trainer bytes its ops read needs ", bytes,
        " bytes, over the capture budget capture.max_bytes = ", max_bytes,
        " bytes; raise capture.max_bytes to at least ", bytes, " or set it to 0 (no capture)"));
  }
  slots_.resize(bytes <= max_bytes / 2 ? 2 : 1);
  layout_ = std::make_shared<const CaptureLayout>(std::move(*layout));
  // The slots' memory now, while the plan loads; a source that is not there yet (or a device
  // that refuses the memory) is left to the first capture, which names it.
  std::map<uint64_t, std::shared_ptr<const registry::RegisteredTensor>> live;
  std::map<int, uint64_t> need;
  if (Need(*layout_, &live, &need).ok()) {
    for (Slot& slot : slots_) {
      if (auto s = EnsureMemory(need, slot.memory.get()); !s.ok()) {
        spdlog::warn("{}: capture memory not taken at load: {}", who, std::string(s.message()));
        break;
      }
    }
  }
  return bytes;
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

absl::Status CaptureStore::EnsureMemory(const std::map<int, uint64_t>& need,
                                        SlotMemory* memory) const {
  for (const auto& [device, bytes] : need) {
    auto& m = (*memory)[device];
    if (m && m.use_count() == 1 && m->size == bytes) continue;
    m = std::make_shared<CaptureMemory>();
    m->size = bytes;
    if (device >= 0) {
      auto buffer = gpu::DeviceBuffer::Allocate(std::max<uint64_t>(bytes, 1), device);
      if (!buffer.ok()) {
        return absl::Status(buffer.status().code(),
                            absl::StrCat("capture memory of ", bytes, " bytes on cuda:", device,
                                         ": ", buffer.status().message()));
      }
      m->device = std::move(*buffer);
    } else {
      m->host.reset(new (std::nothrow) uint8_t[std::max<uint64_t>(bytes, 1)]);
      if (!m->host) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", bytes, " bytes of capture memory"));
      }
      // Paged in now: a first capture into fresh memory took 2-4x as long as the next ones.
      uint8_t* base = m->host.get();
      const uint64_t chunks = (bytes + kCopyChunk - 1) / kCopyChunk;
      ParallelFor(chunks, threads_, [&](uint64_t i) {
        const uint64_t off = i * kCopyChunk;
        std::memset(base + off, 0, std::min(kCopyChunk, bytes - off));
      });
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CapturedSources>> CaptureStore::Copy(
    const CaptureLayout& layout, SlotMemory* memory) const {
  // The live tensors, checked, and the bytes each device (-1: the host) needs.
  std::map<uint64_t, std::shared_ptr<const registry::RegisteredTensor>> live;
  std::map<int, uint64_t> need;
  if (auto s = Need(layout, &live, &need); !s.ok()) return s;
  if (auto s = EnsureMemory(need, memory); !s.ok()) return s;
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
  ParallelFor(host_copies.size(), threads_, [&](uint64_t i) {
    const HostCopy& c = host_copies[i];
    bus_error[i] = !registry::RunBusGuarded([&] { std::memcpy(c.dst, c.src, c.length); });
  });
  for (size_t i = 0; i < host_copies.size(); ++i) {
    if (!bus_error[i]) continue;
    return absl::FailedPreconditionError(
        absl::StrCat(*host_copies[i].what,
                     ": its memory went away during the capture (SIGBUS: the shared-memory object "
                     "was shrunk after registration)"));
  }
  return std::shared_ptr<const CapturedSources>(std::move(sources));
}

absl::Status CaptureStore::Capture(uint64_t version, uint32_t slot, v1::AgentStepReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<const CaptureLayout> layout;
  std::shared_ptr<SlotMemory> memory;
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
    Slot& s = slots_[slot];
    if (s.state != State::kEmpty && s.state != State::kSent) {
      return absl::FailedPreconditionError(absl::StrCat("capture slot ", slot, " is ", Describe(s),
                                                        ": not capturing version ", version,
                                                        " into it"));
    }
    s.state = State::kCapturing;
    s.version = version;
    // The old capture goes first (its memory is reused, or freed before more is taken: the
    // budget holds `slots` captures).
    s.sources.reset();
    memory = s.memory;
    layout = layout_;
    generation = generation_;
  }
  auto sources = Copy(*layout, memory.get());
  absl::MutexLock lock(&mu_);
  if (generation != generation_) {
    return absl::AbortedError("a new plan was loaded during the capture");
  }
  Slot& s = slots_[slot];
  if (!sources.ok()) {
    s = Slot();
    return sources.status();
  }
  s.state = State::kCaptured;
  s.sources = std::move(*sources);
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

void CaptureStore::Discard(uint64_t version) {
  absl::MutexLock lock(&mu_);
  for (Slot& s : slots_) {
    if (s.version == version && (s.state == State::kCaptured || s.state == State::kSent)) {
      s = Slot();
    }
  }
}

}  // namespace wb::executor
