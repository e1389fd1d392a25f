#include "common/metrics/http_exporter.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace wb::metrics {

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(const std::string& listen,
                                                                  const Registry* registry) {
  const auto colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen '", listen, "' is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";

  std::unique_ptr<HttpExporter> exporter(new HttpExporter());
  exporter->server_ = std::make_unique<httplib::Server>();
  httplib::Server& server = *exporter->server_;
  // Scrapes are rare and cheap: two threads, not one per core.
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // httplib's default adds SO_REUSEPORT, which would let a second daemon share the port
  // silently; keep only SO_REUSEADDR (restarts while old connections linger in TIME_WAIT).
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (port == 0) {
    port = server.bind_to_any_port(host);
    if (port < 0) port = 0;
  } else if (!server.bind_to_port(host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen,
                     ": bind failed (port in use, or not an address of this host)"));
  }
  exporter->port_ = port;
  exporter->thread_ = std::thread([&server] { server.listen_after_bind(); });
  // stop() only takes effect once the accept loop runs: wait for it, so the destructor can't hang.
  for (int i = 0; i < 5000 && !server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return exporter;
}

HttpExporter::~HttpExporter() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace wb::metrics
