// Serves a metrics Registry as `GET /metrics` (Prometheus text format) over HTTP with
// cpp-httplib, on its own small thread pool, for the agent's and the controller's
// `metrics_listen` address.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics/metric_registry.h"

namespace httplib {
class Server;
}

namespace wb::metrics {

class HttpExporter {
 public:
  // Binds `listen` ("host:port"; port 0 picks a free one) and starts serving. Fails naming the
  // address when it cannot bind (in use, not a local address, malformed).
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(const std::string& listen,
                                                             const Registry* registry);
  ~HttpExporter();  // stops serving and joins the server thread

  int port() const { return port_; }

 private:
  HttpExporter() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace wb::metrics
