#include "common/parallel/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace wb {

void ParallelFor(uint64_t units, int threads, const std::function<void(uint64_t)>& fn) {
  if (threads <= 1 || units <= 1) {
    for (uint64_t u = 0; u < units; ++u) fn(u);
    return;
  }
  std::atomic<uint64_t> next{0};
  auto worker = [&] {
    for (uint64_t u = next.fetch_add(1); u < units; u = next.fetch_add(1)) fn(u);
  };
  const int n = static_cast<int>(std::min<uint64_t>(threads, units));
  std::vector<std::thread> pool;
  pool.reserve(n - 1);
  for (int i = 1; i < n; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace wb
