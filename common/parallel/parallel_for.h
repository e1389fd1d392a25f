// Splits a loop over independent units across a few short-lived threads: the CPU transforms
// (rows or block rows) and the delta receiver (slots) share it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace wb {

// Runs fn(unit) for every unit in [0, units) on up to `threads` threads, the calling thread
// among them, handing units out in order; returns when all have run. With `threads` <= 1 or
// a single unit everything runs on the calling thread.
void ParallelFor(uint64_t units, int threads, const std::function<void(uint64_t)>& fn);

// std::sort of `v` by `less` on up to `threads` threads: each sorts a slice, then the slices
// are merged. The result is std::sort's wherever `less` is a strict total order.
template <typename T, typename Less>
void ParallelSort(std::vector<T>* v, int threads, Less less) {
  constexpr size_t kMinSlice = 1 << 14;  // below this, threads cost more than they save
  size_t slices = std::max<size_t>(1, std::min<size_t>(threads, v->size() / kMinSlice));
  if (slices <= 1) {
    std::sort(v->begin(), v->end(), less);
    return;
  }
  std::vector<size_t> bounds;
  for (size_t i = 0; i <= slices; ++i) bounds.push_back(v->size() * i / slices);
  ParallelFor(slices, threads, [&](uint64_t i) {
    std::sort(v->begin() + bounds[i], v->begin() + bounds[i + 1], less);
  });
  // Merge neighbours pairwise until one slice is left.
  for (size_t width = 1; width < slices; width *= 2) {
    for (size_t i = 0; i + width < slices; i += 2 * width) {
      const size_t end = bounds[std::min(i + 2 * width, slices)];
      std::inplace_merge(v->begin() + bounds[i], v->begin() + bounds[i + width], v->begin() + end,
                         less);
    }
  }
}

}  // namespace wb
