// Hot-path cost of the metrics registry: ns per Counter::Increment and Histogram::Observe with
// 1 and 2 threads on the same child, and the time to render a scrape of a realistic agent
// (1 step histogram, 256 peers x bytes counters). Prints one JSON line.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/metric_registry.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double NsPerCall(int threads, int calls_per_thread, F f) {
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < calls_per_thread; ++i) f(i);
    });
  }
  for (auto& t : pool) t.join();
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  return ns / calls_per_thread;  // wall time per call as each thread sees it
}

}  // namespace

int main() {
  wb::metrics::Registry r;
  auto* counter = r.AddCounter("weightbeam_bytes_sent_total", "b", {"transport", "peer"})
                      .WithLabels({"tcp", "node-0"});
  auto* hist = r.AddHistogram("weightbeam_step_seconds", "s", wb::metrics::DurationBuckets()).Get();
  auto& family = r.AddCounter("weightbeam_bytes_received_total", "b", {"transport", "peer"});
  for (int p = 0; p < 256; ++p)
    family.WithLabels({"tcp", "node-" + std::to_string(p)})->Increment();

  constexpr int kCalls = 20'000'000;
  const double inc1 = NsPerCall(1, kCalls, [&](int) { counter->Increment(4096); });
  const double inc2 = NsPerCall(2, kCalls, [&](int) { counter->Increment(4096); });
  const double obs1 = NsPerCall(1, kCalls / 4, [&](int i) { hist->Observe(i * 1e-6); });
  const double obs2 = NsPerCall(2, kCalls / 4, [&](int i) { hist->Observe(i * 1e-6); });
  const double lookup = NsPerCall(1, kCalls / 20, [&](int i) {
    family.WithLabels({"tcp", "node-17"})->Increment();
  });
  size_t bytes = 0;
  const double render_us = NsPerCall(1, 200, [&](int) { bytes = r.Render().size(); }) / 1e3;
  std::printf(
      "{\"bench\":\"metrics\",\"counter_increment_ns_1thread\":%.2f,"
      "\"counter_increment_ns_2threads\":%.2f,\"histogram_observe_ns_1thread\":%.2f,"
      "\"histogram_observe_ns_2threads\":%.2f,\"labelled_lookup_and_increment_ns\":%.1f,"
      "\"render_us_258_series\":%.1f,\"render_bytes\":%zu}\n",
      inc1, inc2, obs1, obs2, lookup, render_us, bytes);
  return 0;
}
