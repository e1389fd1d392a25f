// Reads a registered destination tensor's bytes for a check (finite_check, version_digest): in
// pieces of kPieceBytes, host memory in place under the SIGBUS guard (after the backing check,
// for an owner's own object), GPU memory through a host buffer.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "daemon/registry/region_registry.h"

namespace wb::checks {

constexpr uint64_t kPieceBytes = 64ull << 20;

// Calls `fn(data, bytes, offset)` for each consecutive piece of `t.memory` (the staging mirror
// when staged). On host memory `fn` runs inside the bus guard: it must not allocate or lock.
// Fails naming the tensor when its memory was shrunk under the agent or cannot be read back.
absl::Status ReadPieces(const registry::RegisteredTensor& t,
                        const std::function<void(const uint8_t*, uint64_t, uint64_t)>& fn);

}  // namespace wb::checks
