// wb-controller: membership, planning and step coordination for a weightbeam cluster.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc/credentials.h"
#include "common/grpc/message_limits.h"
#include "common/metrics/http_exporter.h"
#include "common/process/daemon_lifecycle.h"
#include "common/process/logging.h"
#include "common/process/malloc_arenas.h"
#include "common/process/mutex_mode.h"
#include "common/version/build_info.h"
#include "config/config.h"
#include "controller/agent_plans.h"
#include "controller/controller_core.h"
#include "controller/controller_metrics.h"
#include "controller/controller_service.h"
#include "controller/high_availability.h"
#include "security/call_guard.h"

int main(int argc, char** argv) {
  CLI::App app{"wb-controller: plans and coordinates weight transfers"};
  std::string config_path, log_level, listen, metrics_listen, advertise;
  bool version = false;
  app.add_option("--config", config_path, "YAML configuration file");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error (overrides config)");
  app.add_option("--listen", listen, "host:port of the Controller service (overrides config)");
  app.add_option("--metrics-listen", metrics_listen,
                 "host:port to serve Prometheus /metrics on (overrides config)");
  app.add_option("--advertise", advertise,
                 "host:port clients and agents reach this controller at, with ha: (overrides "
                 "config; default: the listen address)");
  app.add_flag("--version", version, "print the version and exit");
  CLI11_PARSE(app, argc, argv);
  if (version) {
    std::printf("%s\n", wb::version::Line("wb-controller").c_str());
    return 0;
  }
  wb::config::ControllerConfig config;
  if (!config_path.empty()) {
    auto loaded = wb::config::LoadControllerConfig(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "wb-controller: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    config = *loaded;
  } else {
    config.fusions = wb::config::DefaultFusionRules();
  }
  if (!log_level.empty()) config.log_level = log_level;
  if (!listen.empty()) config.listen = listen;
  if (!metrics_listen.empty()) config.metrics_listen = metrics_listen;
  if (!advertise.empty()) config.ha.advertise = advertise;
  if (config.ha.advertise.empty())
    config.ha.advertise = wb::controller::AdvertisedAddress(config.listen);
  if (auto s = wb::InitLogging("wb-controller", config.log_level); !s.ok()) {
    std::fprintf(stderr, "wb-controller: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // Signals are taken by one thread with sigwait; block them before any thread starts.
  wb::TerminationSignals signals;
  wb::UseFastMutexes();
  // Layouts of 10^6 tensors are parsed, replaced and planned on different gRPC threads.
  wb::LimitMallocArenas(2);

  // A random epoch tells agents that this is a new incarnation: they register again.
  const uint64_t epoch = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  auto server_credentials = wb::grpcutil::MakeServerCredentials(config.tls);
  auto agent_channels = wb::grpcutil::ChannelFactory::FromConfig(config.tls);
  auto guard = wb::security::CallGuard::FromConfig(config.tls, "wb-controller");
  for (const absl::Status& s :
       {server_credentials.status(), agent_channels.status(), guard.status()}) {
    if (!s.ok()) {
      spdlog::error("cannot start: {}", std::string(s.message()));
      return 2;
    }
  }
  wb::controller::ControllerCore core(config, epoch, wb::controller::PlanForAgents);
  core.agent_channels().SetFactory(agent_channels->WithServerName(""));
  wb::controller::ControllerService service(&core, 1000, config.step_timeout_ms);
  service.SetGuard(*guard);
  // With `ha:` this controller leads or stands by (controller/high_availability.h).
  std::unique_ptr<wb::controller::HighAvailability> ha;
  if (config.ha.enabled()) {
    ha = std::make_unique<wb::controller::HighAvailability>(
        config.ha, &core, std::chrono::milliseconds(config.plan_wait_ms));
    service.SetRole(ha.get());
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, *server_credentials, &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(wb::kMaxControlMessageBytes);  // layouts of 10^6 tensors
  // Clients of controllers in high availability ping every 2 s to find a frozen leader fast.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  auto server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::error("cannot listen on {}", config.listen);
    return 1;
  }
  wb::metrics::Registry metrics_registry;
  wb::controller::ControllerMetrics metrics(&core, &metrics_registry, ha.get());
  std::unique_ptr<wb::metrics::HttpExporter> metrics_exporter;
  if (!config.metrics_listen.empty()) {
    auto exporter = wb::metrics::HttpExporter::Start(config.metrics_listen, &metrics_registry);
    if (!exporter.ok()) {
      spdlog::error("cannot start: {}", std::string(exporter.status().message()));
      server->Shutdown();
      return 1;
    }
    metrics_exporter = std::move(*exporter);
    spdlog::info("metrics on port {} (GET /metrics)", metrics_exporter->port());
  }
  spdlog::info(
      "wb-controller serving on port {} (epoch {:x}; {}{})", port, epoch,
      config.tls.enabled ? (config.tls.require_client_cert ? "mutual TLS" : "TLS") : "no TLS",
      config.tls.token_file.empty() ? "" : ", call token required");
  wb::WarnIfInsecure(config.tls.enabled);
  wb::WarnIfCallersUnchecked(config.tls.enabled, !config.tls.ca_file.empty(),
                             !config.tls.token_file.empty());
  if (ha) {
    if (auto s = ha->Start(); !s.ok()) {
      spdlog::error("cannot start: {}", std::string(s.message()));
      server->Shutdown();
      return 2;
    }
  }
  wb::NotifyReady();
  std::atomic<bool> stop{false};
  std::thread sweeper([&] {
    while (!stop) {
      core.Sweep();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::thread waiter([&] {
    int sig = signals.Wait();
    spdlog::info("signal {}: shutting down", sig);
    wb::NotifyStopping();
    stop = true;
    // A step in flight fails now (its agents abort) rather than hanging on a dead controller.
    core.AbortInFlight(absl::StrCat("controller shutting down (signal ", sig, ")"));
    // Leaves the election now: a standby takes over without waiting for the lease to expire.
    if (ha) ha->Stop();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  });
  server->Wait();
  waiter.join();
  sweeper.join();
  return 0;
}
