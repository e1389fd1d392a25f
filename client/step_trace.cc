#include "client/step_trace.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

namespace wb::client {
namespace {

namespace v1 = weightbeam::v1;
using nlohmann::json;

constexpr int kPid = 1;
constexpr int kControllerTid = 0;

json Span(const std::string& name, const char* category, int tid, double ts, double dur,
          json args) {
  return json{{"name", name}, {"cat", category}, {"ph", "X"},  {"pid", kPid},
              {"tid", tid},   {"ts", ts},        {"dur", dur}, {"args", std::move(args)}};
}

json Metadata(const char* name, int tid, json args) {
  json e{{"name", name}, {"ph", "M"}, {"pid", kPid}, {"args", std::move(args)}};
  if (tid >= 0) e["tid"] = tid;
  return e;
}

}  // namespace

std::string StepTraceJson(const std::vector<v1::StepResult>& steps) {
  // One track per agent, numbered in name order after the controller's.
  std::map<std::string, int> tids;
  for (const auto& s : steps) {
    for (const auto& a : s.agents()) tids.emplace(a.agent(), 0);
  }
  int next = kControllerTid + 1;
  for (auto& [name, tid] : tids) tid = next++;

  json events = json::array();
  events.push_back(Metadata("process_name", -1, {{"name", "weightbeam steps"}}));
  events.push_back(Metadata("thread_name", kControllerTid, {{"name", "controller"}}));
  events.push_back(Metadata("thread_sort_index", kControllerTid, {{"sort_index", 0}}));
  for (const auto& [name, tid] : tids) {
    events.push_back(Metadata("thread_name", tid, {{"name", "agent " + name}}));
    events.push_back(Metadata("thread_sort_index", tid, {{"sort_index", tid}}));
  }
  double fallback_ts = 0;  // steps without a start time follow each other, 1 ms apart
  for (const auto& s : steps) {
    const double t0 = s.started_unix_ms() > 0 ? s.started_unix_ms() * 1000.0 : fallback_ts;
    const double dur = std::max(0.0, s.seconds() * 1e6);
    fallback_ts = t0 + dur + 1000;
    json args{{"version", s.version()}, {"ok", s.ok()}, {"bytes", s.bytes()}};
    if (!s.ok()) args["error"] = s.error();
    if (s.committed_replicas_size() > 0) {
      args["committed_replicas"] =
          std::vector<int>(s.committed_replicas().begin(), s.committed_replicas().end());
    }
    events.push_back(Span("step " + std::to_string(s.version()) + (s.ok() ? "" : " FAILED"), "step",
                          kControllerTid, t0, dur, std::move(args)));
    for (const auto& a : s.agents()) {
      const int tid = tids[a.agent()];
      const double adur = std::max(0.0, a.seconds() * 1e6);
      json aargs{{"bytes_sent", a.bytes_sent()},
                 {"ops", a.ops()},
                 {"ok", a.ok()},
                 {"prepare_seconds_all_threads", a.stages().prepare_seconds()},
                 {"peak_staging_bytes", a.stages().peak_staging_bytes()}};
      if (!a.ok()) aargs["error"] = a.error();
      if (a.encode_seconds() > 0) aargs["delta_encode_seconds"] = a.encode_seconds();
      events.push_back(
          Span("step " + std::to_string(s.version()), "agent", tid, t0, adur, std::move(aargs)));
      double cursor = t0;
      const double end = t0 + adur;
      for (const auto& [phase, seconds] :
           {std::pair<const char*, double>{"stage-in", a.stages().stage_in_seconds()},
            {"write", a.stages().write_seconds()},
            {"complete", a.stages().complete_seconds()}}) {
        if (seconds <= 0) continue;
        const double stop = std::min(end, cursor + seconds * 1e6);
        if (stop <= cursor) break;
        events.push_back(Span(phase, "phase", tid, cursor, stop - cursor, {{"seconds", seconds}}));
        cursor = stop;
      }
    }
  }
  json trace{{"traceEvents", std::move(events)},
             {"displayTimeUnit", "ms"},
             {"otherData", {{"generator", "wbctl"}, {"steps", steps.size()}}}};
  return trace.dump() + "\n";
}

}  // namespace wb::client
