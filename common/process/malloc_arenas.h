// glibc malloc settings for daemons that hold millions of small objects. glibc gives a thread
// that meets contention its own arena (up to 8 per core), and memory freed into an arena stays
// with it: the controller parses a layout of 10^6 tensors on one gRPC thread, frees the old one
// from another and plans on a third, and held a third more memory than it used
// (docs/performance.md, "registration at scale").
#pragma once

namespace wb {

// At most `arenas` malloc arenas for the whole process. Call first thing in main, before any
// thread starts.
void LimitMallocArenas(int arenas);

// Gives memory that malloc holds free back to the kernel (after a large transient, such as a
// plan of 10^6 ops).
void ReturnFreeMemory();

}  // namespace wb
