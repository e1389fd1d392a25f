// The Prometheus text format the agent and the controller serve, byte for byte, and the HTTP
// exporter that serves it (including the startup error when the address is taken).
#include <httplib.h>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metric_registry.h"

using wb::metrics::Registry;

TEST_CASE("counter, gauge and histogram render in the Prometheus text format") {
  Registry r;
  auto& bytes =
      r.AddCounter("weightbeam_bytes_sent_total", "Bytes written to peers.", {"transport", "peer"});
  bytes.WithLabels({"tcp", "node-b"})->Increment(4096);
  bytes.WithLabels({"tcp", "node-a"})->Increment(10);
  bytes.WithLabels({"tcp", "node-a"})->Increment(5);
  r.AddGauge("weightbeam_staging_bytes", "Staging bytes in flight.").Get()->Set(1.5);
  auto* h = r.AddHistogram("weightbeam_step_seconds", "Step duration.", {0.5, 0.1, 1}).Get();
  h->Observe(0.05);
  h->Observe(0.1);  // upper bounds are inclusive
  h->Observe(0.7);
  h->Observe(3);
  r.AddCallbackGauge("weightbeam_committed_version", "Last committed version.", [] { return 7; });

  CHECK(r.Render() ==
        "# HELP weightbeam_bytes_sent_total Bytes written to peers.\n"
        "# TYPE weightbeam_bytes_sent_total counter\n"
        "weightbeam_bytes_sent_total{transport=\"tcp\",peer=\"node-a\"} 15\n"
        "weightbeam_bytes_sent_total{transport=\"tcp\",peer=\"node-b\"} 4096\n"
        "# HELP weightbeam_staging_bytes Staging bytes in flight.\n"
        "# TYPE weightbeam_staging_bytes gauge\n"
        "weightbeam_staging_bytes 1.5\n"
        "# HELP weightbeam_step_seconds Step duration.\n"
        "# TYPE weightbeam_step_seconds histogram\n"
        "weightbeam_step_seconds_bucket{le=\"0.1\"} 2\n"
        "weightbeam_step_seconds_bucket{le=\"0.5\"} 2\n"
        "weightbeam_step_seconds_bucket{le=\"1\"} 3\n"
        "weightbeam_step_seconds_bucket{le=\"+Inf\"} 4\n"
        "weightbeam_step_seconds_sum 3.85\n"
        "weightbeam_step_seconds_count 4\n"
        "# HELP weightbeam_committed_version Last committed version.\n"
        "# TYPE weightbeam_committed_version gauge\n"
        "weightbeam_committed_version 7\n");
}

TEST_CASE("label values and help text are escaped") {
  Registry r;
  r.AddCounter("weightbeam_errors_total", "Errors\\by kind\nsee README", {"kind"})
      .WithLabels({"say \"hi\"\\\n"})
      ->Increment();
  CHECK(r.Render() ==
        "# HELP weightbeam_errors_total Errors\\\\by kind\\nsee README\n"
        "# TYPE weightbeam_errors_total counter\n"
        "weightbeam_errors_total{kind=\"say \\\"hi\\\"\\\\\\n\"} 1\n");
}

TEST_CASE("a family without children renders only its HELP and TYPE") {
  Registry r;
  r.AddCounter("weightbeam_steps_total", "Steps.", {"result"});
  CHECK(r.Render() ==
        "# HELP weightbeam_steps_total Steps.\n# TYPE weightbeam_steps_total counter\n");
}

TEST_CASE("gauges go up and down; the same labels give the same child") {
  Registry r;
  auto& g = r.AddGauge("weightbeam_ops_in_flight", "Ops.", {"agent"});
  g.WithLabels({"a"})->Add(3);
  g.WithLabels({"a"})->Add(-1);
  CHECK(g.WithLabels({"a"})->value() == 2);
  CHECK(g.WithLabels({"a"}) != g.WithLabels({"b"}));
}

TEST_CASE("registering a name twice is refused at startup") {
  Registry r;
  r.AddGauge("weightbeam_x", "x");
  CHECK_THROWS_WITH(r.AddCounter("weightbeam_x", "x"), "metric weightbeam_x is registered twice");
}

TEST_CASE("GET /metrics serves the registry; other paths are 404") {
  Registry r;
  r.AddCounter("weightbeam_steps_total", "Steps.", {"result"})
      .WithLabels({"committed"})
      ->Increment(2);
  auto exporter = wb::metrics::HttpExporter::Start("127.0.0.1:0", &r);
  REQUIRE(exporter.ok());
  httplib::Client client("127.0.0.1", (*exporter)->port());
  auto res = client.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "text/plain; version=0.0.4; charset=utf-8");
  CHECK(res->body == r.Render());
  CHECK(res->body.find("weightbeam_steps_total{result=\"committed\"} 2\n") != std::string::npos);
  auto missing = client.Get("/other");
  REQUIRE(missing);
  CHECK(missing->status == 404);
}

TEST_CASE("a taken metrics address is a startup error naming it") {
  Registry r;
  auto first = wb::metrics::HttpExporter::Start("127.0.0.1:0", &r);
  REQUIRE(first.ok());
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = wb::metrics::HttpExporter::Start(taken, &r);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().message() ==
        absl::StrCat("cannot serve metrics on ", taken,
                     ": bind failed (port in use, or not an address of this host)"));
  auto malformed = wb::metrics::HttpExporter::Start("localhost", &r);
  REQUIRE_FALSE(malformed.ok());
  CHECK(malformed.status().message() == "metrics_listen 'localhost' is not host:port");
}
