#include "daemon/staging/version_history.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/staging/staging_mirrors.h"

namespace wb::staging {

namespace {

transport::MemoryRef Host(const std::vector<uint8_t>& bytes) {
  transport::MemoryRef m;
  m.addr = const_cast<uint8_t*>(bytes.data());
  m.length = bytes.size();
  m.kind = transport::MemoryKind::kHost;
  return m;
}

absl::Status LiveBacked(const registry::RegisteredTensor& t) {
  if (!t.hold || t.live.kind != transport::MemoryKind::kHost) return absl::OkStatus();
  return t.hold->CheckBacked(t.live.addr, t.live.length,
                             absl::StrCat("tensor '", t.spec.name(), "'"));
}

}  // namespace

VersionHistory::VersionHistory(int keep, uint64_t budget_bytes)
    : keep_(keep), budget_(budget_bytes) {}

absl::Status VersionHistory::Save(uint64_t version, const Tensors& tensors) {
  if (keep_ <= 0 || version == 0) return absl::OkStatus();
  uint64_t need = 0;
  for (const auto& t : tensors) {
    if (t->staged) need += t->live.length;
  }
  absl::MutexLock lock(&mu_);
  for (const Saved& s : kept_) {
    if (s.version == version) return absl::OkStatus();  // kept already (gone back to it)
  }
  // The oldest kept version makes room when all `keep` are in use (its buffers reused: no
  // new pages); it is given up only once this version fits the budget.
  const bool replacing = static_cast<int>(kept_.size()) >= keep_;
  uint64_t others = 0;
  for (size_t i = 0; i + (replacing ? 1 : 0) < kept_.size(); ++i) {
    for (const auto& [id, b] : kept_[i].by_region) others += b.size();
  }
  if (budget_ != 0 && others + need > budget_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("keeping version ", version, " for rollback needs ", need, " bytes; ", others,
                     " of receive.keep_max_bytes ", budget_, " hold versions ", KeptTextLocked()));
  }
  Saved slot;
  if (replacing) {
    slot = std::move(kept_.back());
    kept_.pop_back();
  }
  std::map<uint64_t, std::vector<uint8_t>> by_region;
  for (const auto& t : tensors) {
    if (!t->staged) continue;
    std::vector<uint8_t> bytes;
    if (auto it = slot.by_region.find(t->region_id); it != slot.by_region.end()) {
      bytes = std::move(it->second);
    }
    bytes.resize(t->live.length);
    absl::Status s = LiveBacked(*t);
    if (s.ok()) s = CopyMemory(Host(bytes), t->live, t->live.length);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("keeping version ", version, " of tensor '",
                                                 t->spec.name(), "' for rollback: ", s.message()));
    }
    by_region[t->region_id] = std::move(bytes);
  }
  kept_.push_front(Saved{version, std::move(by_region)});
  return absl::OkStatus();
}

absl::Status VersionHistory::Restore(uint64_t version, const Tensors& tensors) const {
  absl::MutexLock lock(&mu_);
  auto saved = std::find_if(kept_.begin(), kept_.end(),
                            [&](const Saved& s) { return s.version == version; });
  if (saved == kept_.end()) {
    return absl::NotFoundError(
        absl::StrCat("version ", version, " is not kept here (kept: ", KeptTextLocked(), ")"));
  }
  // Every staged tensor must have been kept, at its size: checked before anything is written.
  for (const auto& t : tensors) {
    if (!t->staged) continue;
    auto it = saved->by_region.find(t->region_id);
    if (it == saved->by_region.end() || it->second.size() != t->live.length) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", t->spec.name(), "' was registered or resized after version ",
                       version, " was kept; it cannot go back to it"));
    }
  }
  for (const auto& t : tensors) {
    if (!t->staged) continue;
    const std::vector<uint8_t>& bytes = saved->by_region.at(t->region_id);
    absl::Status s = LiveBacked(*t);
    if (s.ok()) s = CopyMemory(t->live, Host(bytes), bytes.size());
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("restoring version ", version, " of tensor '",
                                                 t->spec.name(), "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::vector<uint64_t> VersionHistory::Kept() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> out;
  for (const Saved& s : kept_) out.push_back(s.version);
  return out;
}

std::string VersionHistory::KeptText() const {
  absl::MutexLock lock(&mu_);
  return KeptTextLocked();
}

std::string VersionHistory::KeptTextLocked() const {
  std::vector<uint64_t> versions;
  for (const Saved& s : kept_) versions.push_back(s.version);
  return versions.empty() ? "none" : absl::StrJoin(versions, ", ");
}

uint64_t VersionHistory::bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const Saved& s : kept_) {
    for (const auto& [id, b] : s.by_region) n += b.size();
  }
  return n;
}

}  // namespace wb::staging
