// Splits a loop over independent units across a few short-lived threads: the CPU transforms
// (rows or block rows) and the delta receiver (slots) share it.
#pragma once

#include <cstdint>
#include <functional>

namespace wb {

// Runs fn(unit) for every unit in [0, units) on up to `threads` threads, the calling thread
// among them, handing units out in order; returns when all have run. With `threads` <= 1 or
// a single unit everything runs on the calling thread.
void ParallelFor(uint64_t units, int threads, const std::function<void(uint64_t)>& fn);

}  // namespace wb
