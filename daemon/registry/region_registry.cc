#include "daemon/registry/region_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tensor/dtype.h"
#include "common/tensor/tensor_checks.h"

namespace wb::registry {

namespace v1 = weightbeam::v1;

namespace {

uint64_t HandleLength(const v1::MemoryHandle& h) {
  if (h.has_host_shm()) return h.host_shm().length();
  if (h.has_cuda_ipc()) return h.cuda_ipc().length();
  return 0;
}

std::string OwnerName(const v1::Owner& o) {
  if (o.role() == v1::ROLE_TRAINER) return absl::StrCat("trainer rank ", o.rank());
  return absl::StrCat("inference replica ", o.replica(), " rank ", o.rank());
}

// The memory range a part of a buffer shares with the buffer's other parts.
std::string BufferKey(const v1::TensorSpec& spec, const v1::MemoryHandle& h) {
  if (!spec.has_view()) return "";
  if (h.has_host_shm()) {
    return absl::StrCat("shm:", h.host_shm().offset(), ":", h.host_shm().length(), ":",
                        h.host_shm().shm_name());
  }
  return absl::StrCat("cuda:", h.cuda_ipc().device(), ":", h.cuda_ipc().offset(), ":",
                      h.cuda_ipc().length(), ":", h.cuda_ipc().ipc_handle());
}

// Two view parts of one name whose boxes of the tensor share no element: a trainer tensor (a
// Megatron linear_qkv) may hold several boxes of one HF tensor, each registered as a view.
bool DisjointViewParts(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  if (!a.has_view() || !b.has_view() || a.shard_size() == 0 || a.shard_size() != b.shard_size()) {
    return false;
  }
  for (int d = 0; d < a.shard_size(); ++d) {
    const v1::DimSlice &x = a.shard(d), &y = b.shard(d);
    if (x.start() + x.size() <= y.start() || y.start() + y.size() <= x.start()) return true;
  }
  return false;
}

// The memory object a handle points into (one shm object, one CUDA allocation) and the range
// of it the handle covers.
struct ObjectRange {
  std::string key;
  uint64_t offset = 0, length = 0;
};
ObjectRange ObjectOf(const v1::MemoryHandle& h) {
  if (h.has_host_shm()) {
    std::string name = h.host_shm().shm_name();
    if (!name.empty() && name[0] == '/') name.erase(0, 1);  // shm_open's "/x" and "x" are one
    return {absl::StrCat("shm:", name), h.host_shm().offset(), h.host_shm().length()};
  }
  return {absl::StrCat("cuda:", h.cuda_ipc().device(), ":", h.cuda_ipc().ipc_handle()),
          h.cuda_ipc().offset(), h.cuda_ipc().length()};
}

std::string RangeText(uint64_t offset, uint64_t length) {
  return absl::StrCat("[", offset, ", ", offset + length, ")");
}

// One buffer registration per memory range, access and place: sources and destinations of one
// object are registered apart (only destinations take remote writes).
std::string BufferRegistrationKey(const transport::MemoryRef& buffer, transport::Access access) {
  return absl::StrCat(access == transport::Access::kDestination ? "dst" : "src", ":",
                      buffer.kind == transport::MemoryKind::kCuda ? "cuda" : "host", ":",
                      buffer.device, ":", reinterpret_cast<uintptr_t>(buffer.addr), ":",
                      buffer.length);
}

}  // namespace

RegionRegistry::RegionRegistry(std::vector<transport::Transport*> transports, MemoryOpener opener)
    : transports_(std::move(transports)), opener_(std::move(opener)) {
  for (transport::Transport* tr : transports_) {
    windowed_.push_back(tr->caps().windows);
    rekeys_.push_back(tr->caps().windows && tr->caps().rekeys);
  }
  counts_.resize(transports_.size());
}

absl::StatusOr<v1::RegionDescriptor> RegionRegistry::TimedRegister(size_t i,
                                                                   const transport::MemoryRef& mem,
                                                                   transport::Access access,
                                                                   bool buffer) {
  const auto t0 = std::chrono::steady_clock::now();
  auto desc =
      buffer ? transports_[i]->RegisterBuffer(mem, access) : transports_[i]->Register(mem, access);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  absl::MutexLock lock(&stats_mu_);
  counts_[i].seconds += seconds;
  if (desc.ok()) {
    ++counts_[i].regions;
    ++counts_[i].registered;
  }
  return desc;
}

void RegionRegistry::CountDeregistered(size_t i) {
  absl::MutexLock lock(&stats_mu_);
  if (counts_[i].regions > 0) --counts_[i].regions;
}

bool RegionRegistry::RefreshKeys(size_t i, uint64_t region, uint64_t length, LiveKeys* live,
                                 double seconds) {
  auto desc = transports_[i]->BufferKeys(region);
  if (!desc.ok()) {
    spdlog::warn("reading buffer region {}'s keys from {}: {}", region, transports_[i]->Name(),
                 desc.status().ToString());
    return false;
  }
  const std::string name = transports_[i]->Name();
  std::vector<v1::RemoteKey> keys;
  for (auto k : desc->keys()) {
    k.set_transport_region(region);
    if (k.transport().empty()) k.set_transport(name);
    k.set_region_length(length);
    keys.push_back(std::move(k));
  }
  {
    absl::MutexLock lock(&live->mu);
    std::vector<v1::RemoteKey>& now = live->keys[name];
    bool same = now.size() == keys.size();
    for (size_t k = 0; same && k < keys.size(); ++k) {
      same = now[k].key() == keys[k].key() && now[k].device() == keys[k].device();
    }
    if (same) return false;
    now = std::move(keys);
  }
  absl::MutexLock lock(&stats_mu_);
  ++counts_[i].registered;  // a re-registration: the live count is unchanged
  counts_[i].seconds += seconds;
  return true;
}

void RegionRegistry::FillRegion(const RegisteredTensor& t, v1::RegionDescriptor* out) {
  *out = t.descriptor;
  if (!t.live_keys) return;
  absl::MutexLock lock(&t.live_keys->mu);
  for (const auto& [name, keys] : t.live_keys->keys) {
    if (!t.transport_regions.count(name)) continue;
    for (const v1::RemoteKey& key : keys) {
      v1::RemoteKey* k = out->add_keys();
      *k = key;
      k->set_base(t.BaseIn(name));
    }
  }
}

std::vector<TransportRegistrationStats> RegionRegistry::RegistrationStats() const {
  std::vector<TransportRegistrationStats> out;
  absl::MutexLock lock(&stats_mu_);
  for (size_t i = 0; i < transports_.size(); ++i) {
    out.push_back(
        {transports_[i]->Name(), counts_[i].regions, counts_[i].registered, counts_[i].seconds});
  }
  return out;
}

absl::Status RegionRegistry::AttachToBuffer(RegisteredTensor* t, const OpenedMemory& opened,
                                            transport::Access access) {
  const transport::MemoryRef& buffer = opened.buffer;
  const auto start = reinterpret_cast<uintptr_t>(buffer.addr);
  const auto mine = reinterpret_cast<uintptr_t>(opened.ref.addr);
  if (mine < start || opened.ref.length > buffer.length ||
      mine - start > buffer.length - opened.ref.length) {
    return absl::InternalError("its memory lies outside the buffer it was opened in");
  }
  const uint64_t offset = mine - start;
  const std::string key = BufferRegistrationKey(buffer, access);
  absl::MutexLock lock(&buffers_mu_);
  auto [it, fresh] = buffers_.try_emplace(key);
  BufferRegistration& b = it->second;
  // Undoes what this call did when it fails: the windows it opened, a buffer left unused.
  std::vector<std::pair<size_t, uint64_t>> opened_windows;
  auto fail = [&](absl::Status why) {
    for (auto [i, region] : opened_windows) {
      transports_[i]->CloseWindow(region, offset, opened.ref.length).IgnoreError();
      // A rekeying transport registered the buffer afresh for its other tensors.
      if (rekeys_[i] && b.tensors > 0) RefreshKeys(i, region, buffer.length, b.live.get(), 0);
    }
    if (b.tensors == 0) {
      for (size_t i = 0; i < transports_.size(); ++i) {
        auto r = b.regions.find(transports_[i]->Name());
        if (r == b.regions.end()) continue;
        transports_[i]->Deregister(r->second).IgnoreError();
        CountDeregistered(i);
      }
      buffers_.erase(it);
    }
    return why;
  };
  if (fresh) {
    b.hold = opened.hold;
    b.memory = buffer;
    for (size_t i = 0; i < transports_.size(); ++i) {
      if (!windowed_[i]) continue;
      const std::string name = transports_[i]->Name();
      auto desc = TimedRegister(i, buffer, access, /*buffer=*/true);
      if (!desc.ok() && transport::IsDeclined(desc.status())) {
        b.declined[name] = std::string(desc.status().message());
        continue;
      }
      if (!desc.ok()) {
        return fail(
            absl::Status(desc.status().code(), absl::StrCat("registering its buffer with ", name,
                                                            " failed: ", desc.status().message())));
      }
      b.regions[name] = desc->region_id();
      for (auto k : desc->keys()) {
        k.set_transport_region(desc->region_id());
        if (k.transport().empty()) k.set_transport(name);
        k.set_region_length(buffer.length);
        b.keys[name].push_back(k);
      }
      if (rekeys_[i]) {
        absl::MutexLock keys_lock(&b.live->mu);
        b.live->keys[name] = b.keys[name];
      }
    }
  }
  for (size_t i = 0; i < transports_.size(); ++i) {
    const std::string name = transports_[i]->Name();
    auto r = b.regions.find(name);
    if (!windowed_[i] || r == b.regions.end()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = transports_[i]->OpenWindow(r->second, offset, opened.ref.length); !s.ok()) {
      return fail(
          absl::Status(s.code(), absl::StrCat("opening its window in ", name, ": ", s.message())));
    }
    opened_windows.emplace_back(i, r->second);
    t->transport_regions[name] = r->second;
    t->transport_bases[name] = offset;
    if (rekeys_[i]) {
      // Its keys are the buffer's of the moment (FillRegion); opening may have registered it.
      RefreshKeys(i, r->second, buffer.length, b.live.get(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      t->live_keys = b.live;
      continue;
    }
    for (v1::RemoteKey k : b.keys[name]) {
      k.set_base(offset);
      *t->descriptor.add_keys() = std::move(k);
    }
  }
  for (const auto& [name, why] : b.declined) t->declined[name] = why;
  ++b.tensors;
  t->buffer_registration = key;
  return absl::OkStatus();
}

bool RegionRegistry::DetachFromBuffer(const std::string& registration,
                                      const std::vector<const RegisteredTensor*>& tensors) {
  absl::MutexLock lock(&buffers_mu_);
  auto it = buffers_.find(registration);
  if (it == buffers_.end()) return false;
  BufferRegistration& b = it->second;
  const bool last = b.tensors <= tensors.size();
  bool rekeyed = false;
  for (size_t i = 0; i < transports_.size(); ++i) {
    const std::string name = transports_[i]->Name();
    auto r = b.regions.find(name);
    if (r == b.regions.end()) continue;
    std::vector<std::pair<uint64_t, uint64_t>> windows;
    for (const RegisteredTensor* t : tensors) {
      if (t->transport_regions.count(name)) windows.emplace_back(t->BaseIn(name), t->memory.length);
    }
    if (windows.empty()) continue;
    // When this returns, no write into these tensors' bytes can land through this transport.
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = transports_[i]->CloseWindows(r->second, windows); !s.ok()) {
      spdlog::warn("closing {} tensor window(s) (the first '{}') in {}: {}", windows.size(),
                   tensors.front()->spec.name(), name, s.ToString());
    }
    // The buffer's last tensors: it is deregistered below, its keys are not read again.
    if (rekeys_[i] && !last) {
      rekeyed |=
          RefreshKeys(i, r->second, b.memory.length, b.live.get(),
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  b.tensors -= std::min<uint64_t>(b.tensors, tensors.size());
  if (b.tensors > 0) return rekeyed;
  for (size_t i = 0; i < transports_.size(); ++i) {
    auto r = b.regions.find(transports_[i]->Name());
    if (r == b.regions.end()) continue;
    if (auto s = transports_[i]->Deregister(r->second); !s.ok()) {
      spdlog::warn("deregistering a buffer from {}: {}", transports_[i]->Name(), s.ToString());
    }
    CountDeregistered(i);
  }
  buffers_.erase(it);
  return rekeyed;
}

void RegionRegistry::SetChangeCallback(std::function<void()> cb) { on_change_ = std::move(cb); }

void RegionRegistry::Changed() {
  if (on_change_) on_change_();
}

absl::Status RegionRegistry::CheckConflicts(uint64_t session, const v1::Owner& owner,
                                            const v1::TensorSpec& spec,
                                            const std::string& buffer_key,
                                            const v1::MemoryHandle* memory) const {
  // Two destinations of different tensors never share a byte: two senders would write it and
  // the commit would hold whichever landed last. Parts of one buffer (views) share its memory
  // by design and are checked element by element below; a replicated tensor's copy (the same
  // name) may be the same bytes, whose writes are the same values.
  // Only once the caller has opened the memory (its access checked): a refusal names another
  // owner's tensors, which a caller without access to that memory must not learn.
  if (owner.role() == v1::ROLE_INFERENCE && memory != nullptr) {
    const ObjectRange mine = ObjectOf(*memory);
    if (auto same = by_object_.find(mine.key); same != by_object_.end() && mine.length > 0) {
      // Destinations of different names never overlap, so only ranges starting inside this one
      // and those with the nearest start before it can reach into it.
      const auto& ranges = same->second;
      auto first = ranges.upper_bound(mine.offset);
      if (first != ranges.begin()) first = ranges.lower_bound(std::prev(first)->first);
      const auto last = ranges.lower_bound(mine.offset + mine.length);
      for (auto r = first; r != last; ++r) {
        const RegisteredTensor& other = *by_region_.at(r->second);
        if (other.spec.name() == spec.name()) continue;
        if (!buffer_key.empty() && other.buffer_key == buffer_key) continue;
        if (mine.offset >= other.object_offset + other.object_length ||
            other.object_offset >= mine.offset + mine.length) {
          continue;
        }
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", spec.name(), "': its memory ", RangeText(mine.offset, mine.length),
            " overlaps destination tensor '", other.spec.name(), "' (", OwnerName(other.owner),
            ", bytes ", RangeText(other.object_offset, other.object_length),
            ") in the same memory object: two destinations may not share bytes"));
      }
    }
  }
  // Parts of one buffer agree on its dtype and shape and never share an element.
  if (auto parts = by_buffer_.find(buffer_key); !buffer_key.empty() && parts != by_buffer_.end()) {
    for (uint64_t id : parts->second) {
      const v1::TensorSpec& other = by_region_.at(id)->spec;
      const std::string buffer = absl::StrCat("buffer '", spec.view().buffer(), "'");
      if (other.dtype() != spec.dtype() ||
          !std::equal(other.view().shape().begin(), other.view().shape().end(),
                      spec.view().shape().begin(), spec.view().shape().end())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", spec.name(), "': its view of ", buffer, " (",
            tensor::DTypeName(spec.dtype()), " [", absl::StrJoin(spec.view().shape(), ", "),
            "]) disagrees with part '", other.name(), "' (", tensor::DTypeName(other.dtype()), " [",
            absl::StrJoin(other.view().shape(), ", "), "]) in the same memory"));
      }
      if (ViewPartsOverlap(spec, other)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", spec.name(), "' at offset [", absl::StrJoin(spec.view().offset(), ", "),
            "] overlaps part '", other.name(), "' at offset [",
            absl::StrJoin(other.view().offset(), ", "), "] inside ", buffer));
      }
    }
  }
  auto named = by_name_.find(spec.name());
  if (named == by_name_.end()) return absl::OkStatus();
  for (uint64_t id : named->second) {
    const RegisteredTensor& t = *by_region_.at(id);
    const bool same_owner = t.owner.role() == owner.role() &&
                            t.owner.replica() == owner.replica() && t.owner.rank() == owner.rank();
    if (same_owner && !DisjointViewParts(spec, t.spec)) {
      return absl::AlreadyExistsError(absl::StrCat("tensor '", spec.name(),
                                                   "' is already registered by ", OwnerName(owner),
                                                   " (pid ", t.owner.pid(), ")"));
    }
  }
  return absl::OkStatus();
}

void RegionRegistry::IndexLocked(const RegisteredTensor& t) {
  by_name_[t.spec.name()].push_back(t.region_id);
  by_session_[t.session].push_back(t.region_id);
  if (!t.buffer_key.empty()) by_buffer_[t.buffer_key].push_back(t.region_id);
  if (!t.object_key.empty()) by_object_[t.object_key].emplace(t.object_offset, t.region_id);
}

void RegionRegistry::UnindexLocked(const RegisteredTensor& t) {
  auto drop = [](auto& index, const auto& key, uint64_t id) {
    auto it = index.find(key);
    if (it == index.end()) return;
    auto& ids = it->second;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == id) {
        ids[i] = ids.back();
        ids.pop_back();
        break;
      }
    }
    if (ids.empty()) index.erase(it);
  };
  drop(by_name_, t.spec.name(), t.region_id);
  drop(by_session_, t.session, t.region_id);
  if (!t.buffer_key.empty()) drop(by_buffer_, t.buffer_key, t.region_id);
  if (auto object = by_object_.find(t.object_key);
      !t.object_key.empty() && object != by_object_.end()) {
    auto [from, to] = object->second.equal_range(t.object_offset);
    for (auto r = from; r != to; ++r) {
      if (r->second == t.region_id) {
        object->second.erase(r);
        break;
      }
    }
    if (object->second.empty()) by_object_.erase(object);
  }
}

void RegionRegistry::NotifyChanged() { Changed(); }

absl::StatusOr<v1::TensorLayout> RegionRegistry::Register(
    uint64_t session, const v1::Owner& owner, const v1::TensorRegistration& registration,
    const Caller& caller) {
  auto id = RegisterQuiet(session, owner, registration, caller, /*notify=*/true);
  if (!id.ok()) return id.status();
  auto t = Find(*id);
  v1::TensorLayout layout;
  if (t == nullptr) return layout;  // withdrawn meanwhile
  *layout.mutable_spec() = t->spec;
  *layout.mutable_owner() = t->owner;
  FillRegion(*t, layout.mutable_region());  // with a rekeying buffer's keys of the moment
  layout.set_location(t->location);
  return layout;
}

absl::StatusOr<uint64_t> RegionRegistry::RegisterQuiet(uint64_t session, const v1::Owner& owner,
                                                       const v1::TensorRegistration& registration,
                                                       const Caller& caller, bool notify) {
  const v1::TensorSpec& spec = registration.spec();
  if (owner.role() != v1::ROLE_TRAINER && owner.role() != v1::ROLE_INFERENCE) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name(), "': the session has no role (trainer/inference)"));
  }
  if (!registration.memory().has_host_shm() && !registration.memory().has_cuda_ipc()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name(), "': no memory handle (host_shm or cuda_ipc)"));
  }
  if (auto s = ValidateTensorSpec(spec, HandleLength(registration.memory())); !s.ok()) return s;
  const std::string buffer_key = BufferKey(spec, registration.memory());
  {
    absl::MutexLock lock(&mu_);
    if (auto s = CheckConflicts(session, owner, spec, buffer_key, nullptr); !s.ok()) return s;
  }
  auto opened = opener_(registration.memory(), caller);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("tensor '", spec.name(), "': ", opened.status().message()));
  }
  auto t = std::make_shared<RegisteredTensor>();
  t->session = session;
  t->spec = spec;
  t->buffer_key = buffer_key;
  if (owner.role() == v1::ROLE_INFERENCE) {
    ObjectRange object = ObjectOf(registration.memory());
    t->object_key = std::move(object.key);
    t->object_offset = object.offset;
    t->object_length = object.length;
  }
  t->owner = owner;
  if (caller.known) t->uid = caller.uid;
  t->live = opened->ref;
  if (stager_ != nullptr && owner.role() == v1::ROLE_INFERENCE) {
    auto mirror = stager_->Mirror(*opened, caller);
    if (!mirror.ok()) {
      return absl::Status(
          mirror.status().code(),
          absl::StrCat("tensor '", spec.name(), "': staging: ", mirror.status().message()));
    }
    if (mirror->has_value()) {
      opened = std::move(**mirror);
      t->staged = true;
    }
  }
  t->memory = opened->ref;
  t->location = opened->location;
  t->hold = opened->hold;
  const auto access = owner.role() == v1::ROLE_INFERENCE ? transport::Access::kDestination
                                                         : transport::Access::kSource;
  // Transports with windows register the tensor's buffer once and open a window for it.
  const bool in_buffer = opened->buffer.addr != nullptr &&
                         std::find(windowed_.begin(), windowed_.end(), true) != windowed_.end();
  if (in_buffer) {
    if (auto s = AttachToBuffer(t.get(), *opened, access); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("tensor '", spec.name(), "': ", s.message()));
    }
  }
  for (size_t i = 0; i < transports_.size(); ++i) {
    transport::Transport* tr = transports_[i];
    if (in_buffer && windowed_[i]) continue;
    auto desc = TimedRegister(i, t->memory, access, /*buffer=*/false);
    if (!desc.ok() && transport::IsDeclined(desc.status())) {
      // This transport cannot take this region (GPU memory it cannot pin); the others may.
      t->declined[tr->Name()] = std::string(desc.status().message());
      spdlog::info("tensor '{}' ({}): not registered with {}: {}", spec.name(), t->location,
                   tr->Name(), std::string(desc.status().message()));
      continue;
    }
    if (!desc.ok()) {
      Release(*t);
      return absl::Status(desc.status().code(),
                          absl::StrCat("tensor '", spec.name(), "': registering with ", tr->Name(),
                                       " failed: ", desc.status().message()));
    }
    t->transport_regions[tr->Name()] = desc->region_id();
    for (auto key : desc->keys()) {
      key.set_transport_region(desc->region_id());
      if (key.transport().empty()) key.set_transport(tr->Name());
      *t->descriptor.add_keys() = key;
    }
  }
  if (t->transport_regions.empty() && !t->declined.empty()) {
    std::string why;
    for (const auto& [name, reason] : t->declined)
      absl::StrAppend(&why, why.empty() ? "" : "; ", reason);
    Release(*t);  // its buffer's count, where every windowed transport declined the buffer
    return absl::FailedPreconditionError(absl::StrCat("tensor '", spec.name(), "' (", t->location,
                                                      "): no transport can register it: ", why));
  }
  t->descriptor.set_length(t->memory.length);
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    // Re-check: another session may have registered the same name meanwhile.
    if (auto s = CheckConflicts(session, owner, spec, buffer_key, &registration.memory());
        !s.ok()) {
      Release(*t);
      return s;
    }
    t->region_id = next_region_++;
    t->descriptor.set_region_id(t->region_id);
    by_region_[t->region_id] = t;
    IndexLocked(*t);
    ++generation_;
    id = t->region_id;
  }
  if (notify) Changed();
  return id;
}

void RegionRegistry::Release(const RegisteredTensor& t) { ReleaseAll({&t}); }

bool RegionRegistry::ReleaseAll(const std::vector<const RegisteredTensor*>& tensors) {
  // Per buffer registration, its tensors in the order given.
  std::map<std::string, std::vector<const RegisteredTensor*>> by_buffer;
  for (const RegisteredTensor* t : tensors) {
    for (size_t i = 0; i < transports_.size(); ++i) {
      transport::Transport* tr = transports_[i];
      auto it = t->transport_regions.find(tr->Name());
      if (it == t->transport_regions.end()) continue;
      if (!t->buffer_registration.empty() && windowed_[i]) continue;  // the buffer's, below
      if (auto s = tr->Deregister(it->second); !s.ok()) {
        spdlog::warn("deregistering tensor '{}' from {}: {}", t->spec.name(), tr->Name(),
                     s.ToString());
      }
      CountDeregistered(i);
    }
    if (!t->buffer_registration.empty()) by_buffer[t->buffer_registration].push_back(t);
  }
  bool rekeyed = false;
  for (const auto& [registration, members] : by_buffer) {
    rekeyed |= DetachFromBuffer(registration, members);
  }
  return rekeyed;
}

absl::Status RegionRegistry::Unregister(uint64_t session, const std::string& name) {
  std::shared_ptr<RegisteredTensor> victim;
  {
    absl::MutexLock lock(&mu_);
    auto named = by_name_.find(name);
    if (named != by_name_.end()) {
      for (uint64_t id : named->second) {
        auto it = by_region_.find(id);
        if (it->second->session != session) continue;
        victim = it->second;
        UnindexLocked(*victim);
        by_region_.erase(it);
        ++generation_;
        break;
      }
    }
  }
  if (!victim) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", name, "' is not registered by this session"));
  }
  if (ReleaseAll({victim.get()})) {
    // The buffer's other tensors have new keys: a layout fetched since the generation moved
    // above may carry the old ones.
    absl::MutexLock lock(&mu_);
    ++generation_;
  }
  Changed();
  return absl::OkStatus();
}

int RegionRegistry::WithdrawSession(uint64_t session) {
  std::vector<std::shared_ptr<RegisteredTensor>> victims;
  {
    absl::MutexLock lock(&mu_);
    auto owned = by_session_.find(session);
    if (owned != by_session_.end()) {
      const std::vector<uint64_t> ids = std::move(owned->second);
      by_session_.erase(owned);
      for (uint64_t id : ids) {
        auto it = by_region_.find(id);
        victims.push_back(it->second);
        by_region_.erase(it);
        UnindexLocked(*victims.back());  // the session's entry is gone already
      }
    }
    if (!victims.empty()) ++generation_;
  }
  std::vector<const RegisteredTensor*> released;
  released.reserve(victims.size());
  for (const auto& v : victims) released.push_back(v.get());
  if (ReleaseAll(released)) {
    absl::MutexLock lock(&mu_);
    ++generation_;
  }
  if (!victims.empty()) Changed();
  return static_cast<int>(victims.size());
}

std::shared_ptr<const RegisteredTensor> RegionRegistry::Find(uint64_t region_id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_region_.find(region_id);
  if (it == by_region_.end()) return nullptr;
  return it->second;
}

void RegionRegistry::UnregisterRegions(uint64_t session, const std::vector<uint64_t>& region_ids) {
  std::vector<std::shared_ptr<RegisteredTensor>> victims;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : region_ids) {
      auto it = by_region_.find(id);
      if (it == by_region_.end() || it->second->session != session) continue;
      victims.push_back(it->second);
      UnindexLocked(*it->second);
      by_region_.erase(it);
      ++generation_;
    }
  }
  if (victims.empty()) return;
  std::vector<const RegisteredTensor*> raw;
  for (const auto& v : victims) raw.push_back(v.get());
  if (ReleaseAll(raw)) {
    absl::MutexLock lock(&mu_);
    ++generation_;
  }
  Changed();
}

std::vector<std::shared_ptr<const RegisteredTensor>> RegionRegistry::Destinations() const {
  std::vector<std::shared_ptr<const RegisteredTensor>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, t] : by_region_) {
    if (t->owner.role() == v1::ROLE_INFERENCE) out.push_back(t);
  }
  return out;
}

v1::AgentLayout RegionRegistry::Layout(const std::string& agent_name) const {
  v1::AgentLayout layout;
  layout.set_agent(agent_name);
  absl::MutexLock lock(&mu_);
  layout.set_generation(generation_);
  for (const auto& [id, t] : by_region_) {
    auto* tl = layout.add_tensors();
    *tl->mutable_spec() = t->spec;
    *tl->mutable_owner() = t->owner;
    FillRegion(*t, tl->mutable_region());
    tl->set_location(t->location);
  }
  return layout;
}

uint64_t RegionRegistry::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

size_t RegionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return by_region_.size();
}

}  // namespace wb::registry
