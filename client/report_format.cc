#include "client/report_format.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "client/table.h"

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
  return out;
}

std::string FormatStep(const v1::StepResult& r) {
  std::string out =
      absl::StrCat("step ", r.version(), ": ", r.ok() ? "committed" : "FAILED", ", ",
                   HumanBytes(r.bytes()), " in ", FixedPoint(r.seconds()), " s (",
                   FixedPoint(r.seconds() > 0 ? r.bytes() / r.seconds() / 1e9 : 0, 2), " GB/s)\n");
  if (!r.ok()) out += absl::StrCat("  error: ", r.error(), "\n");
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

}  // namespace wb::client
