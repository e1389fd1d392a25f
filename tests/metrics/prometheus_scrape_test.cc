// End to end with a real Prometheus server: wb-demo runs a controller and two agents with
// /metrics on loopback ports and pushes two steps; Prometheus (Debian's `prometheus`) scrapes
// them every second, and its query API must show the steps, the bytes and the agents.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/support/process.h"

namespace {

using wb::testing::Process;

constexpr char kPrometheus[] = "/usr/bin/prometheus";

// Instant query; the value when it selects exactly one series, nullopt otherwise.
std::optional<double> Query(int prom_port, const std::string& expr) {
  httplib::Client client("127.0.0.1", prom_port);
  client.set_read_timeout(5, 0);
  auto res = client.Get("/api/v1/query", httplib::Params{{"query", expr}}, httplib::Headers{});
  if (!res || res->status != 200) return std::nullopt;
  auto body = nlohmann::json::parse(res->body, nullptr, false);
  if (body.is_discarded() || body.value("status", "") != "success") return std::nullopt;
  const auto& result = body["data"]["result"];
  if (!result.is_array() || result.size() != 1) return std::nullopt;
  return std::stod(result[0]["value"][1].get<std::string>());
}

std::string PrometheusConfig(int controller, int trainer, int inference) {
  auto target = [](int port, const char* node) {
    return absl::StrCat("      - targets: ['127.0.0.1:", port, "']\n        labels: {node: ", node,
                        "}\n");
  };
  return absl::StrCat(
      "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
      "scrape_configs:\n"
      "  - job_name: wb-controller\n    static_configs:\n",
      target(controller, "controller"), "  - job_name: wb-agent\n    static_configs:\n",
      target(trainer, "trainer-node"), target(inference, "inference-node"));
}

}  // namespace

TEST_CASE("Prometheus scrapes the controller and both agents through two real steps") {
  INFO("Debian's prometheus must be installed at " << kPrometheus << " (./wb deps installs it)");
  REQUIRE(access(kPrometheus, X_OK) == 0);
  const std::string dir = wb::testing::TempDir("wb-prom-");
  const int ctl = wb::testing::FreePort();
  const int trainer = wb::testing::FreePort();
  const int inference = wb::testing::FreePort();
  const int prom = wb::testing::FreePort();
  std::ofstream(dir + "/prometheus.yml") << PrometheusConfig(ctl, trainer, inference);

  Process prometheus({kPrometheus, "--config.file=" + dir + "/prometheus.yml",
                      "--storage.tsdb.path=" + dir + "/tsdb",
                      absl::StrCat("--web.listen-address=127.0.0.1:", prom), "--log.level=warn"},
                     dir + "/prometheus.log");
  const std::string agent = wb::testing::Runfile("daemon/wb-agent");
  const std::string bin_dir =
      agent.substr(0, agent.size() - std::string("/daemon/wb-agent").size());
  const std::string demo_log = dir + "/demo.log";
  Process demo({wb::testing::Runfile("tests/demo/wb-demo"), "--bin-dir", bin_dir, "--layers", "1",
                "--steps", "2", "--metrics-ports", absl::StrCat(ctl, ",", trainer, ",", inference),
                "--hold-seconds", "240"},
               demo_log);

  INFO("logs in " << dir);
  REQUIRE(wb::testing::WaitUntil(
      [&] {
        return wb::testing::ReadFile(demo_log).find("holding every process") != std::string::npos ||
               !demo.running();
      },
      std::chrono::seconds(180)));
  const std::string steps_log = wb::testing::ReadFile(demo_log);
  INFO(steps_log);
  REQUIRE(demo.running());

  // Every target is up and a scrape after the second commit has landed.
  auto value = [&](const std::string& expr) { return Query(prom, expr).value_or(NAN); };
  const bool scraped = wb::testing::WaitUntil(
      [&] {
        return value("count(up == 1)") == 3 &&
               value("weightbeam_steps_total{result=\"committed\"}") == 2 &&
               value("weightbeam_committed_version{node=\"inference-node\"}") == 2 &&
               value("weightbeam_agent_steps_total{node=\"trainer-node\",result=\"ok\"}") == 2;
      },
      std::chrono::seconds(60));
  INFO(wb::testing::ReadFile(dir + "/prometheus.log"));
  REQUIRE(scraped);

  // Controller.
  CHECK(value("weightbeam_steps_total{result=\"failed\"}") == 0);
  CHECK(value("weightbeam_controller_step_duration_seconds_count") == 2);
  CHECK(value("weightbeam_controller_step_duration_seconds_sum") > 0);
  CHECK(value("weightbeam_controller_step_duration_seconds_bucket{le=\"+Inf\"}") == 2);
  // Who waited: in place, the trainer for each whole step and the one replica for its transfer.
  CHECK(value("weightbeam_trainer_stall_seconds_count") == 2);
  CHECK(value("weightbeam_trainer_stall_seconds_sum") > 0);
  CHECK(value("weightbeam_inference_pause_seconds_count") == 2);
  CHECK(value("weightbeam_inference_pause_seconds_sum") > 0);
  CHECK(value("weightbeam_agents_alive") == 2);
  CHECK(value("weightbeam_agents_lost") == 0);
  const double plan_bytes = value("weightbeam_plan_bytes");
  CHECK(plan_bytes > 0);
  CHECK(value("weightbeam_plan_ops") > 0);
  CHECK(value("weightbeam_plan_predicted_step_seconds") > 0);

  // The sending agent: exactly two steps of the plan's bytes, all over tcp to the inference node.
  const double sent = value(
      "weightbeam_bytes_sent_total{node=\"trainer-node\",transport=\"tcp\","
      "peer=\"inference-node\"}");
  CHECK(sent > 0);
  CHECK(sent == 2 * plan_bytes);
  CHECK(value("sum(weightbeam_bytes_sent_total{node=\"trainer-node\"})") == sent);
  CHECK(value("weightbeam_agent_step_duration_seconds_count{node=\"trainer-node\"}") == 2);
  CHECK(value("weightbeam_agent_steps_total{node=\"trainer-node\",result=\"failed\"}") == 0);
  CHECK(value("weightbeam_ops_in_flight{node=\"trainer-node\"}") == 0);
  CHECK(value("weightbeam_staging_bytes_in_flight{node=\"trainer-node\"}") == 0);

  // The receiving agent saw exactly those bytes arrive from the trainer node.
  CHECK(value("weightbeam_bytes_received_total{node=\"inference-node\",transport=\"tcp\","
              "peer=\"trainer-node\"}") == sent);

  // Both agents: tensors registered, no errors of any kind.
  CHECK(value("weightbeam_registered_tensors{node=\"trainer-node\"}") > 0);
  CHECK(value("weightbeam_registered_tensors{node=\"inference-node\"}") > 0);
  CHECK(value("count(weightbeam_errors_total{job=\"wb-agent\"})") == 8);  // 4 kinds x 2 agents
  CHECK(value("sum(weightbeam_errors_total)") == 0);

  // The demo ends cleanly when told to, having verified both steps bit for bit.
  demo.Signal(SIGTERM);
  CHECK(demo.Wait(std::chrono::seconds(60)) == 0);
  CHECK(wb::testing::ReadFile(demo_log).find("PASS: 2 steps committed") != std::string::npos);
}
