#include "common/metrics/metric_registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace wb::metrics {

namespace {

// Label values escape backslash, double quote and newline; HELP text backslash and newline.
std::string Escape(const std::string& s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// `{a="x",b="y"}` (with `extra` appended, e.g. le="0.5"), or "" without labels.
std::string LabelText(const std::vector<std::string>& names, const std::vector<std::string>& values,
                      const std::string& extra = "") {
  std::string out;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"", Escape(values[i], true), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, out.empty() ? "" : ",", extra);
  return out.empty() ? "" : absl::StrCat("{", out, "}");
}

void AtomicAddDouble(std::atomic<uint64_t>* bits, double delta) {
  uint64_t old = bits->load(std::memory_order_relaxed);
  for (;;) {
    double v;
    std::memcpy(&v, &old, sizeof(v));
    v += delta;
    uint64_t next;
    std::memcpy(&next, &v, sizeof(next));
    if (bits->compare_exchange_weak(old, next, std::memory_order_relaxed)) return;
  }
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

void Gauge::Add(double delta) { AtomicAddDouble(&bits_, delta); }

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  // The first bound >= v (bucket upper bounds are inclusive); past the end is +Inf.
  size_t i = std::lower_bound(bounds_->begin(), bounds_->end(), v) - bounds_->begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAddDouble(&sum_bits_, v);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_->size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

double Histogram::sum() const {
  return detail::FromBits(sum_bits_.load(std::memory_order_relaxed));
}

std::vector<double> DurationBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

void Registry::Add(Entry entry) {
  absl::MutexLock lock(&mu_);
  for (const auto& e : entries_) {
    if (e.name == entry.name) {
      throw std::logic_error(absl::StrCat("metric ", entry.name, " is registered twice"));
    }
  }
  entries_.push_back(std::move(entry));
}

template <typename T>
Family<T>& Registry::AddScalar(const char* type, const std::string& name, const std::string& help,
                               std::vector<std::string> label_names,
                               std::string (*format)(const T&)) {
  std::shared_ptr<Family<T>> family(
      new Family<T>(name, help, std::move(label_names), [] { return std::make_unique<T>(); }));
  Family<T>* f = family.get();
  Add({type, name, help,
       [f, format](std::string* out) {
         absl::MutexLock lock(&f->mu_);
         for (const auto& [values, child] : f->children_) {
           absl::StrAppend(out, f->name_, LabelText(f->label_names_, values), " ", format(*child),
                           "\n");
         }
       },
       family});
  return *f;
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  return AddScalar<Counter>("counter", name, help, std::move(label_names),
                            [](const Counter& c) { return absl::StrCat(c.value()); });
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  return AddScalar<Gauge>("gauge", name, help, std::move(label_names),
                          [](const Gauge& g) { return FormatValue(g.value()); });
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> bounds,
                                          std::vector<std::string> label_names) {
  std::sort(bounds.begin(), bounds.end());
  auto shared_bounds = std::make_shared<const std::vector<double>>(std::move(bounds));
  std::shared_ptr<Family<Histogram>> family(new Family<Histogram>(
      name, help, std::move(label_names),
      [shared_bounds] { return std::make_unique<Histogram>(shared_bounds.get()); }));
  Family<Histogram>* f = family.get();
  Add({"histogram", name, help,
       [f, shared_bounds](std::string* out) {
         absl::MutexLock lock(&f->mu_);
         for (const auto& [values, h] : f->children_) {
           const auto counts = h->CumulativeCounts();
           for (size_t i = 0; i < counts.size(); ++i) {
             std::string le = i < shared_bounds->size() ? FormatValue((*shared_bounds)[i]) : "+Inf";
             absl::StrAppend(out, f->name_, "_bucket",
                             LabelText(f->label_names_, values, absl::StrCat("le=\"", le, "\"")),
                             " ", counts[i], "\n");
           }
           const std::string labels = LabelText(f->label_names_, values);
           absl::StrAppend(out, f->name_, "_sum", labels, " ", FormatValue(h->sum()), "\n");
           absl::StrAppend(out, f->name_, "_count", labels, " ", counts.back(), "\n");
         }
       },
       family});
  return *f;
}

void Registry::AddCallbackGauge(const std::string& name, const std::string& help,
                                std::function<double()> read) {
  Add({"gauge", name, help,
       [name, read = std::move(read)](std::string* out) {
         absl::StrAppend(out, name, " ", FormatValue(read()), "\n");
       },
       nullptr});
}

std::string Registry::Render() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& e : entries_) {
    absl::StrAppend(&out, "# HELP ", e.name, " ", Escape(e.help, false), "\n");
    absl::StrAppend(&out, "# TYPE ", e.name, " ", e.type, "\n");
    e.render_samples(&out);
  }
  return out;
}

}  // namespace wb::metrics
