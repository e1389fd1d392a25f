// The agent's Prometheus series (names prefixed weightbeam_): step durations, bytes per transport
// and peer, errors by kind, and gauges read at scrape time from the executor, the staging pool
// and the region registry. AgentNode owns one and updates it where the events happen.
#pragma once

#include <functional>
#include <string>

#include "common/metrics/metric_registry.h"

namespace wb::service {

class AgentMetrics {
 public:
  // Error kinds of weightbeam_errors_total (each rendered from 0 on).
  static constexpr const char* kStepFailed = "step_failed";
  static constexpr const char* kRegistrationRefused = "registration_refused";
  static constexpr const char* kPlanLoadFailed = "plan_load_failed";
  static constexpr const char* kCommitRefused = "commit_refused";

  // What the gauges read when scraped.
  struct Sources {
    std::function<double()> ops_in_flight;
    std::function<double()> staging_bytes_in_flight;
    std::function<double()> registered_tensors;
    std::function<double()> committed_version;
  };

  explicit AgentMetrics(metrics::Registry* registry);
  // Registers the scrape-time gauges; call once the modules they read exist.
  void AddGauges(Sources sources);

  void StepFinished(double seconds, bool ok);
  void Error(const char* kind) { errors_->WithLabels({kind})->Increment(); }
  metrics::Counter* BytesSent(const std::string& transport, const std::string& peer) {
    return bytes_sent_->WithLabels({transport, peer});
  }
  metrics::Counter* BytesReceived(const std::string& transport, const std::string& peer) {
    return bytes_received_->WithLabels({transport, peer});
  }
  // Writes this agent's step fence refused (another step's: an aborted or timed-out one's).
  metrics::Counter* FencedWrites(const std::string& transport, const std::string& peer) {
    return fenced_writes_->WithLabels({transport, peer});
  }
  // Memory registrations held with a transport (one per buffer where it has windows) and the
  // seconds spent registering since start.
  void TransportRegistrations(const std::string& transport, uint64_t regions, double seconds) {
    transport_regions_->WithLabels({transport})->Set(static_cast<double>(regions));
    registration_seconds_->WithLabels({transport})->Set(seconds);
  }

 private:
  metrics::Registry* registry_;
  metrics::Histogram* step_seconds_;
  metrics::Family<metrics::Counter>* steps_;
  metrics::Family<metrics::Counter>* bytes_sent_;
  metrics::Family<metrics::Counter>* bytes_received_;
  metrics::Family<metrics::Counter>* fenced_writes_;
  metrics::Family<metrics::Counter>* errors_;
  metrics::Family<metrics::Gauge>* transport_regions_;
  metrics::Family<metrics::Gauge>* registration_seconds_;
};

}  // namespace wb::service
