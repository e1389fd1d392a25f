// wbctl's step traces (client/step_trace) against the Trace Event Format (the JSON object form
// that chrome://tracing and ui.perfetto.dev open): every event well formed, one named track per
// agent plus the controller's, spans on a track properly nested, phases inside their step.
#include "client/step_trace.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace v1 = weightbeam::v1;
using nlohmann::json;

namespace {

v1::StepResult MakeStep(uint64_t version, int64_t started_ms, double seconds) {
  v1::StepResult s;
  s.set_version(version);
  s.set_ok(true);
  s.set_seconds(seconds);
  s.set_bytes(3 << 20);
  s.set_started_unix_ms(started_ms);
  s.add_committed_replicas(0);
  return s;
}

void AddAgent(v1::StepResult* s, const std::string& name, double seconds, double stage_in,
              double write, double complete) {
  auto* a = s->add_agents();
  a->set_agent(name);
  a->set_ok(true);
  a->set_seconds(seconds);
  a->set_bytes_sent(1 << 20);
  a->set_ops(3);
  a->mutable_stages()->set_stage_in_seconds(stage_in);
  a->mutable_stages()->set_prepare_seconds(write * 3);  // several threads
  a->mutable_stages()->set_write_seconds(write);
  a->mutable_stages()->set_complete_seconds(complete);
}

struct Track {
  std::string name;
  std::vector<json> spans;
};

// Checks the Trace Event Format's rules that viewers rely on and returns the tracks by tid.
std::map<int, Track> Validate(const std::string& text) {
  const json trace = json::parse(text);  // throws on malformed JSON
  REQUIRE(trace.is_object());
  REQUIRE(trace.contains("traceEvents"));
  REQUIRE(trace["traceEvents"].is_array());
  if (trace.contains("displayTimeUnit")) {
    REQUIRE((trace["displayTimeUnit"] == "ms" || trace["displayTimeUnit"] == "ns"));
  }
  std::map<int, Track> tracks;
  const std::set<std::string> phases = {"X", "B", "E", "i", "I", "M", "C", "b", "e", "n"};
  for (const json& e : trace["traceEvents"]) {
    REQUIRE(e.is_object());
    REQUIRE(e.contains("name"));
    REQUIRE(e["name"].is_string());
    REQUIRE(e.contains("ph"));
    REQUIRE(phases.count(e["ph"].get<std::string>()) == 1);
    REQUIRE(e.contains("pid"));
    REQUIRE(e["pid"].is_number_integer());
    if (e.contains("args")) REQUIRE(e["args"].is_object());
    if (e["ph"] == "M") {
      const std::set<std::string> kinds = {"process_name", "process_labels", "process_sort_index",
                                           "thread_name", "thread_sort_index"};
      REQUIRE(kinds.count(e["name"].get<std::string>()) == 1);
      REQUIRE(e.contains("args"));
      if (e["name"] == "thread_name") {
        REQUIRE(e["tid"].is_number_integer());
        REQUIRE(e["args"]["name"].is_string());
        tracks[e["tid"].get<int>()].name = e["args"]["name"].get<std::string>();
      }
      continue;
    }
    REQUIRE(e.contains("tid"));
    REQUIRE(e["tid"].is_number_integer());
    REQUIRE(e.contains("ts"));
    REQUIRE(e["ts"].is_number());
    REQUIRE(e["ts"].get<double>() >= 0);
    if (e["ph"] == "X") {
      REQUIRE(e.contains("dur"));
      REQUIRE(e["dur"].is_number());
      REQUIRE(e["dur"].get<double>() >= 0);
      tracks[e["tid"].get<int>()].spans.push_back(e);
    }
  }
  // Complete events on one track nest: each starts after its enclosing span and ends within it.
  for (auto& [tid, track] : tracks) {
    INFO("track " << tid << " (" << track.name << ")");
    REQUIRE(!track.name.empty());  // every track with spans is named
    std::stable_sort(track.spans.begin(), track.spans.end(), [](const json& a, const json& b) {
      return a["ts"].get<double>() < b["ts"].get<double>();
    });
    std::vector<double> open_ends;
    for (const json& s : track.spans) {
      const double ts = s["ts"].get<double>(), end = ts + s["dur"].get<double>();
      while (!open_ends.empty() && ts >= open_ends.back() - 1e-6) open_ends.pop_back();
      if (!open_ends.empty()) REQUIRE(end <= open_ends.back() + 1e-6);
      open_ends.push_back(end);
    }
  }
  return tracks;
}

std::vector<std::string> Names(const Track& t) {
  std::vector<std::string> out;
  for (const json& s : t.spans) out.push_back(s["name"].get<std::string>());
  return out;
}

}  // namespace

TEST_CASE("a step's trace: a controller track and one track per agent with its phases") {
  auto s1 = MakeStep(1, 1'700'000'000'000, 0.5);
  AddAgent(&s1, "train-0", 0.4, 0.05, 0.3, 0.01);
  AddAgent(&s1, "infer-0", 0.1, 0, 0, 0);
  auto s2 = MakeStep(2, 1'700'000'001'000, 0.25);
  AddAgent(&s2, "train-0", 0.2, 0.02, 0.15, 0.01);
  AddAgent(&s2, "infer-0", 0.05, 0, 0, 0);
  auto tracks = Validate(wb::client::StepTraceJson({s1, s2}));
  REQUIRE(tracks.size() == 3);
  REQUIRE(tracks[0].name == "controller");
  REQUIRE(Names(tracks[0]) == std::vector<std::string>{"step 1", "step 2"});
  REQUIRE(tracks[0].spans[0]["ts"].get<double>() == 1'700'000'000'000'000.0);
  REQUIRE(tracks[0].spans[0]["dur"].get<double>() == Approx(500'000));
  REQUIRE(tracks[0].spans[1]["args"]["version"] == 2);
  // Agents in name order after the controller.
  REQUIRE(tracks[1].name == "agent infer-0");
  REQUIRE(tracks[2].name == "agent train-0");
  REQUIRE(Names(tracks[2]) == std::vector<std::string>{"step 1", "stage-in", "write", "complete",
                                                       "step 2", "stage-in", "write", "complete"});
  const json& write = tracks[2].spans[2];
  REQUIRE(write["ts"].get<double>() == Approx(1'700'000'000'000'000.0 + 50'000));
  REQUIRE(write["dur"].get<double>() == Approx(300'000));
  REQUIRE(tracks[2].spans[0]["args"]["prepare_seconds_all_threads"].get<double>() == Approx(0.9));
  REQUIRE(Names(tracks[1]) == std::vector<std::string>{"step 1", "step 2"});
}

TEST_CASE("phases longer than the agent's span are clipped to it; a failed step says so") {
  auto s = MakeStep(7, 1'700'000'000'000, 0.1);
  s.set_ok(false);
  s.set_error("agent train-0 lost");
  AddAgent(&s, "train-0", 0.1, 0.08, 0.08, 0.08);  // 0.24 s of phases in 0.1 s
  auto tracks = Validate(wb::client::StepTraceJson({s}));
  REQUIRE(Names(tracks[0]) == std::vector<std::string>{"step 7 FAILED"});
  REQUIRE(tracks[0].spans[0]["args"]["error"] == "agent train-0 lost");
  REQUIRE(Names(tracks[1]) == std::vector<std::string>{"step 7", "stage-in", "write"});
  REQUIRE(tracks[1].spans[2]["dur"].get<double>() == Approx(20'000));
}

TEST_CASE("steps without a start time follow each other; no steps is an empty trace") {
  auto a = MakeStep(1, 0, 0.002);
  auto b = MakeStep(2, 0, 0.002);
  auto tracks = Validate(wb::client::StepTraceJson({a, b}));
  REQUIRE(tracks[0].spans.size() == 2);
  REQUIRE(tracks[0].spans[1]["ts"].get<double>() >
          tracks[0].spans[0]["ts"].get<double>() + tracks[0].spans[0]["dur"].get<double>());
  auto empty = Validate(wb::client::StepTraceJson({}));
  REQUIRE(empty.size() == 1);  // the controller's track, named, no spans
}
