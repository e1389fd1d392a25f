#include "daemon/checks/tensor_pieces.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/staging.h"
#include "daemon/registry/bus_guard.h"

namespace wb::checks {

absl::Status ReadPieces(const registry::RegisteredTensor& t,
                        const std::function<void(const uint8_t*, uint64_t, uint64_t)>& fn) {
  const auto* base = static_cast<const uint8_t*>(t.memory.addr);
  const uint64_t length = t.memory.length;
  if (base == nullptr || length == 0) return absl::OkStatus();
  if (t.memory.kind == transport::MemoryKind::kCuda) {
    std::vector<uint8_t> host(std::min(kPieceBytes, length));
    for (uint64_t at = 0; at < length; at += kPieceBytes) {
      const uint64_t n = std::min(kPieceBytes, length - at);
      if (auto s = gpu::CopyAnyToAny(host.data(), base + at, n, t.memory.device); !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("tensor '", t.spec.name(),
                                         "': reading it back for the check: ", s.message()));
      }
      fn(host.data(), n, at);
    }
    return absl::OkStatus();
  }
  if (!t.staged && t.hold) {  // the owner's own object: still backed?
    if (auto s = t.hold->CheckBacked(base, length, t.spec.name()); !s.ok()) return s;
  }
  const bool completed = registry::RunBusGuarded([&] {
    for (uint64_t at = 0; at < length; at += kPieceBytes) {
      fn(base + at, std::min(kPieceBytes, length - at), at);
    }
  });
  if (!completed) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", t.spec.name(), "': its memory was shrunk under the agent"));
  }
  return absl::OkStatus();
}

}  // namespace wb::checks
