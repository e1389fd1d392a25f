// wb-agent: the per-node weightbeam daemon (run by systemd on every GPU node).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "common/process/daemon_lifecycle.h"
#include "common/process/logging.h"
#include "common/process/malloc_arenas.h"
#include "common/process/mutex_mode.h"
#include "common/version/build_info.h"
#include "config/config.h"
#include "daemon/service/agent_node.h"

int main(int argc, char** argv) {
  CLI::App app{"wb-agent: moves model weights between training and inference GPUs"};
  std::string config_path;
  std::string log_level;
  std::string name, socket, listen, controller, tcp_listen, metrics_listen;
  bool version = false;
  app.add_option("--config", config_path, "YAML configuration file");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error (overrides config)");
  app.add_option("--name", name, "agent name (overrides config)");
  app.add_option("--socket", socket, "Unix socket of the Local service (overrides config)");
  app.add_option("--listen", listen, "host:port of the Agent service (overrides config)");
  app.add_option("--controller", controller, "controller host:port (overrides config)");
  app.add_option("--tcp-listen", tcp_listen, "host:port of the tcp data plane (overrides config)");
  app.add_option("--metrics-listen", metrics_listen,
                 "host:port to serve Prometheus /metrics on (overrides config)");
  app.add_flag("--version", version, "print the version and exit");
  CLI11_PARSE(app, argc, argv);
  if (version) {
    std::printf("%s\n", wb::version::Line("wb-agent").c_str());
    return 0;
  }

  wb::config::AgentConfig config;
  if (!config_path.empty()) {
    auto loaded = wb::config::LoadAgentConfig(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "wb-agent: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    config = *loaded;
  }
  if (!log_level.empty()) config.log_level = log_level;
  if (!name.empty()) config.name = name;
  if (!socket.empty()) config.local_socket = socket;
  if (!listen.empty()) config.listen = listen;
  if (!controller.empty()) config.controller = controller;
  if (!tcp_listen.empty()) config.tcp.listen = tcp_listen;
  if (!metrics_listen.empty()) config.metrics_listen = metrics_listen;
  if (auto s = wb::InitLogging("wb-agent", config.log_level); !s.ok()) {
    std::fprintf(stderr, "wb-agent: %s\n", std::string(s.message()).c_str());
    return 2;
  }

  // Signals are taken by one thread with sigwait; block them before any thread starts.
  wb::TerminationSignals signals;
  wb::UseFastMutexes();
  // Registrations, layout reports and plans of 10^6 entries run on different gRPC threads.
  wb::LimitMallocArenas(2);

  wb::service::AgentNode node(config);
  if (auto s = node.Start(); !s.ok()) {
    spdlog::error("cannot start: {}", std::string(s.message()));
    return 1;
  }
  wb::WarnIfInsecure(config.tls.enabled);
  wb::WarnIfCallersUnchecked(config.tls.enabled, !config.tls.ca_file.empty(),
                             !config.tls.token_file.empty());
  wb::NotifyReady();
  std::thread waiter([&] {
    int sig = signals.Wait();
    spdlog::info("signal {}: shutting down", sig);
    wb::NotifyStopping();
    node.Shutdown();
  });
  node.Wait();
  waiter.join();
  return 0;
}
