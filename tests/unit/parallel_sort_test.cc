// ParallelSort against std::sort: any size (below, at and above the slice minimum), any
// thread count (odd ones leave an unpaired slice in a merge round), any comparator.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/parallel/parallel_for.h"

namespace {

std::vector<uint64_t> RandomValues(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> v(n);
  for (auto& x : v) x = rng() % (n + 1);  // duplicates included
  return v;
}

}  // namespace

TEST_CASE("ParallelSort orders like std::sort for any size and thread count") {
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{1000}, size_t{16384}, size_t{40000}, size_t{100003}}) {
    for (int threads : {1, 2, 3, 5, 8}) {
      INFO("n " << n << ", threads " << threads);
      auto v = RandomValues(n, n * 31 + threads);
      auto want = v;
      std::sort(want.begin(), want.end());
      wb::ParallelSort(&v, threads, [](uint64_t a, uint64_t b) { return a < b; });
      CHECK(v == want);
    }
  }
}

TEST_CASE("ParallelSort sorts indices by the strings they name, as the planner does") {
  std::mt19937 rng(7);
  std::vector<std::string> names;
  for (int i = 0; i < 60000; ++i) {
    names.push_back("model.layers." + std::to_string(rng() % 5000) + ".w" + std::to_string(i));
  }
  std::vector<int32_t> order(names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  auto by_name = [&](int32_t a, int32_t b) { return names[a] < names[b]; };
  wb::ParallelSort(&order, 4, by_name);
  REQUIRE(order.size() == names.size());
  for (size_t i = 1; i < order.size(); ++i) {
    INFO("position " << i);
    REQUIRE(names[order[i - 1]] < names[order[i]]);
  }
  std::vector<int32_t> seen = order;
  std::sort(seen.begin(), seen.end());
  for (size_t i = 0; i < seen.size(); ++i) REQUIRE(seen[i] == static_cast<int32_t>(i));
}
