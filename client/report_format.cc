#include "client/report_format.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/table.h"
#include "common/wire/state_words.h"

namespace wb::client {

namespace v1 = weightbeam::v1;

std::string FixedPoint(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string FormatPlan(const v1::PlanSummary& p) {
  std::string out =
      absl::StrCat("plan ", p.plan_id(), " (hash ", p.plan_hash(), "): ", p.total_ops(), " ops, ",
                   HumanBytes(p.total_bytes()), ", ", p.phases(), " phase(s)\n");
  Table t({"ROLE", "AGENT", "BYTES", "OPS"});
  for (const auto& s : p.senders()) {
    t.Add({"sender", s.agent(), HumanBytes(s.bytes()), std::to_string(s.ops())});
  }
  for (const auto& r : p.receivers()) {
    t.Add({"receiver", r.agent(), HumanBytes(r.bytes()), std::to_string(r.ops())});
  }
  out += t.Render();
  out += absl::StrCat("imbalance (max/mean): senders ", FixedPoint(p.sender_imbalance(), 2),
                      ", receivers ", FixedPoint(p.receiver_imbalance(), 2),
                      "; predicted step time ", FixedPoint(p.predicted_step_seconds()), " s\n");
  if (p.link_rate_scale_size() > 0) {
    std::map<std::string, double> sorted(p.link_rate_scale().begin(), p.link_rate_scale().end());
    std::vector<std::string> slow;
    for (const auto& [agent, f] : sorted)
      slow.push_back(absl::StrCat(agent, " ", FixedPoint(f, 2)));
    out += absl::StrCat(
        "links measured slow (fraction of their rating): ", absl::StrJoin(slow, ", "), "\n");
  }
  if (p.relay_roots() > 0) {
    out += absl::StrCat("relays: ", p.relay_roots(),
                        " replica(s) per family fed by the senders, "
                        "fan-out ",
                        p.relay_fanout(), ", depth ", p.relay_depth(), "; ",
                        HumanBytes(p.relayed_bytes()), " forwarded by ", p.relays_size(),
                        " relay(s); predicted ", FixedPoint(p.predicted_without_relays_seconds()),
                        " s without relays, receivers' limit ",
                        FixedPoint(p.receiver_limit_seconds()), " s\n");
  }
  if (p.delta().enabled()) {
    out += absl::StrCat("delta mode: on (anchor every ", p.delta().anchor_every(),
                        " steps, receive slots ", FixedPoint(p.delta().receive_fraction(), 2),
                        " of dense bytes, verify ", p.delta().verify() ? "on" : "off", ")\n");
  }
  return out;
}

namespace {

// "sent 12.3 MiB of 717.1 MiB dense (58.3x less; 1500 delta ops, 80 dense)", or "" when the
// step was not a delta-mode step.
std::string DeltaLine(const v1::StepResult& r) {
  if (!r.delta_anchor() && r.delta_ops() == 0) return "";
  std::string out =
      absl::StrCat("sent ", HumanBytes(r.bytes()), " of ", HumanBytes(r.bytes_dense()), " dense");
  if (r.delta_anchor()) return out + " (delta anchor: every op dense)";
  return absl::StrCat(out, " (", FixedPoint(r.bytes() ? double(r.bytes_dense()) / r.bytes() : 0, 1),
                      "x less; ", r.delta_ops(), " delta ops, ", r.dense_ops(), " dense)");
}

// "trainer held 0.012 s (captured); inference paused 0.004 s (replica 0: 0.004 s staged, ...)":
// who waited for the step (docs/clients.md), or "" for a step that reports neither.
std::string WaitLine(const v1::StepResult& r) {
  if (r.trainer_stall_seconds() <= 0 && r.replica_pauses_size() == 0) return "";
  std::string out = absl::StrCat("trainer held ", FixedPoint(r.trainer_stall_seconds()), " s");
  if (!r.capture().empty()) absl::StrAppend(&out, " (", r.capture(), ")");
  if (r.replica_pauses_size() == 0) return out;
  std::vector<std::string> pauses;
  for (const auto& p : r.replica_pauses()) {
    pauses.push_back(absl::StrCat("replica ", p.replica(), ": ", FixedPoint(p.seconds()), " s ",
                                  p.staged() ? "swap" : "in place"));
  }
  return absl::StrCat(out, "; inference paused ", FixedPoint(r.inference_pause_seconds()), " s (",
                      absl::StrJoin(pauses, ", "), ")");
}

}  // namespace

std::string FormatDeltaHistory(const google::protobuf::RepeatedPtrField<v1::StepResult>& steps) {
  Table t({"VERSION", "OK", "SENT", "DENSE", "RATIO", "KIND"});
  for (const auto& r : steps) {
    t.Add({std::to_string(r.version()), r.ok() ? "yes" : "no", HumanBytes(r.bytes()),
           HumanBytes(r.bytes_dense()),
           r.bytes() ? FixedPoint(double(r.bytes_dense()) / r.bytes(), 1) + "x" : "-",
           r.delta_anchor()    ? "anchor"
           : r.delta_ops() > 0 ? "delta"
                               : "dense"});
  }
  return steps.empty() ? "no steps yet\n" : "recent steps:\n" + t.Render();
}

std::string FormatReplicas(const v1::StatusResponse& s) {
  if (s.replicas_size() == 0) return "";
  // The digest column only when the plan digests versions (VersionChecks.digest).
  bool digests = false;
  for (const auto& r : s.replicas()) digests = digests || !r.digest().empty();
  std::vector<std::string> columns = {"REPLICA", "STATE", "COMMITTED", "STALENESS", "AGENTS"};
  if (digests) columns.push_back("DIGEST");
  Table t(columns);
  for (const auto& r : s.replicas()) {
    std::vector<std::string> row = {std::to_string(r.replica()), wb::wire::StateWord(r.state()),
                                    std::to_string(r.committed_version()),
                                    std::to_string(r.staleness()), absl::StrJoin(r.agents(), ",")};
    if (digests) row.push_back(r.digest().empty() ? "-" : r.digest());
    t.Add(row);
  }
  return absl::StrCat("inference replicas (min_replicas ", s.min_replicas(), "):\n", t.Render());
}

std::string FormatStep(const v1::StepResult& r) {
  if (r.rollback()) {
    return absl::StrCat("rollback to version ", r.version(), ": ", r.ok() ? "live again" : "FAILED",
                        " on replica(s) ", absl::StrJoin(r.committed_replicas(), ","), " in ",
                        FixedPoint(r.seconds(), 3), " s",
                        r.ok() ? "" : absl::StrCat(": ", r.error()), "\n");
  }
  std::string out =
      absl::StrCat("step ", r.version(), ": ", r.ok() ? "committed" : "FAILED", ", ",
                   HumanBytes(r.bytes()), " in ", FixedPoint(r.seconds()), " s (",
                   FixedPoint(r.seconds() > 0 ? r.bytes() / r.seconds() / 1e9 : 0, 2), " GB/s)\n");
  if (std::string d = DeltaLine(r); !d.empty()) out += "  " + d + "\n";
  if (!r.partial().empty()) out += "  " + r.partial() + "\n";
  if (std::string w = WaitLine(r); !w.empty()) out += "  " + w + "\n";
  if (r.predicted_seconds() > 0) {
    out += absl::StrCat(
        "  predicted ", FixedPoint(r.predicted_seconds()), " s (",
        r.seconds() > 0 ? FixedPoint((r.predicted_seconds() / r.seconds() - 1) * 100, 1) : "-",
        " %) by ", r.prediction(), "\n");
  }
  if (!r.replanned().empty()) out += absl::StrCat("  re-planned: ", r.replanned(), "\n");
  if (!r.ok()) out += absl::StrCat("  error: ", r.error(), "\n");
  if (r.committed_replicas_size() > 0 || r.skipped_replicas_size() > 0) {
    out += absl::StrCat(
        "  committed to replica(s): ",
        r.committed_replicas_size() ? absl::StrJoin(r.committed_replicas(), ", ") : "none", "\n");
  }
  for (const auto& s : r.skipped_replicas()) {
    out += absl::StrCat("  skipped replica ", s.replica(), ": ", s.reason(), "\n");
  }
  Table t({"AGENT", "OK", "BYTES", "DENSE", "OPS", "SECONDS", "PREPARE", "WRITE", "PEAK STAGING"});
  for (const auto& a : r.agents()) {
    t.Add({a.agent(), a.ok() ? "yes" : "no", HumanBytes(a.bytes_sent()),
           HumanBytes(a.bytes_dense()), std::to_string(a.ops()), FixedPoint(a.seconds()),
           FixedPoint(a.stages().prepare_seconds()), FixedPoint(a.stages().write_seconds()),
           HumanBytes(a.stages().peak_staging_bytes())});
  }
  if (r.agents_size() > 0) out += t.Render();
  return out;
}

std::string FormatLeadership(const v1::StatusResponse& s) {
  const v1::Leadership& l = s.leadership();
  if (!l.enabled()) return "";
  const int64_t age_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count() -
                         l.since_unix_ms();
  return absl::StrCat("election ", l.election(), ": this controller (", l.self(), ") is ",
                      l.state(), " for ", absl::StrFormat("%.1f", age_ms / 1000.0), " s; leader ",
                      l.leader().empty() ? "none" : l.leader(), " (epoch ", l.epoch(),
                      "); standbys ",
                      l.standbys().empty() ? "none" : absl::StrJoin(l.standbys(), ", "), "\n");
}

}  // namespace wb::client
