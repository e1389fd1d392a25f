// Prometheus metrics for the agent and the controller: counters, gauges and histograms with
// labels, updated with atomics on the hot path (resolve a labelled child once, keep the pointer),
// and rendered in the Prometheus text exposition format (version 0.0.4) when scraped.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace wb::metrics {

namespace detail {
inline uint64_t ToBits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}
inline double FromBits(uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof(v));
  return v;
}
}  // namespace detail

// A monotonically increasing integer count (bytes, errors, steps).
class Counter {
 public:
  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { bits_.store(detail::ToBits(v), std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return detail::FromBits(bits_.load(std::memory_order_relaxed)); }

 private:
  std::atomic<uint64_t> bits_{0};  // the double's bit pattern (0 bits == 0.0)
};

// Observations counted into fixed buckets (upper bounds, ascending; +Inf is implicit).
class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double v);

  // Cumulative counts per bound, then the +Inf bucket (== count).
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double>* bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bound + the +Inf bucket
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_bits_{0};
};

// Buckets for step durations in seconds: 1 ms .. 2 min.
std::vector<double> DurationBuckets();

// One metric name with its children, one per combination of label values.
template <typename T>
class Family {
 public:
  // Returns the child for `values` (one per label name, in order), creating it at first use. The
  // pointer stays valid for the registry's lifetime: look it up once, update it lock-free.
  T* WithLabels(const std::vector<std::string>& values);
  // The child of a family without labels.
  T* Get() { return WithLabels({}); }

 private:
  friend class Registry;
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::function<std::unique_ptr<T>()> make)
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        make_(std::move(make)) {}

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Names must be unique within the registry; families are rendered in the order added.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> bounds,
                                  std::vector<std::string> label_names = {});
  // A gauge read when scraped (state another module already keeps: queue depth, versions).
  // `read` runs on the scraping thread and must be thread-safe.
  void AddCallbackGauge(const std::string& name, const std::string& help,
                        std::function<double()> read);

  // Every family in the Prometheus text exposition format.
  std::string Render() const;

 private:
  // A family of one-number children (counters, gauges) of Prometheus `type`: one
  // "name{labels} value" line per child, the value written by `format`.
  template <typename T>
  Family<T>& AddScalar(const char* type, const std::string& name, const std::string& help,
                       std::vector<std::string> label_names, std::string (*format)(const T&));

  struct Entry {
    std::string type;  // "counter", "gauge", "histogram"
    std::string name;
    std::string help;
    std::function<void(std::string*)> render_samples;
    std::shared_ptr<void> owner;
  };
  void Add(Entry entry);

  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

template <typename T>
T* Family<T>::WithLabels(const std::vector<std::string>& values) {
  absl::MutexLock lock(&mu_);
  auto& child = children_[values];
  if (!child) child = make_();
  return child.get();
}

// Formats a sample value the way Prometheus reads it back exactly ("+Inf", "NaN", shortest
// round-trip decimal otherwise).
std::string FormatValue(double v);

}  // namespace wb::metrics
