// Turns off Abseil's mutex deadlock detection for the whole process. Debian builds Abseil
// without NDEBUG, so every absl::Mutex lock (gRPC's own included) records the lock order in one
// global graph behind one global spin lock: with hundreds of agents it was the first entry of
// the controller's profile and serialized the gRPC threads (docs/performance.md).
#pragma once

namespace wb {

// Call first thing in main, before any thread starts.
void UseFastMutexes();

}  // namespace wb
