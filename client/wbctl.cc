// wbctl: the weightbeam command line. Talks to the controller (--controller or WB_CONTROLLER).
#include <google/protobuf/util/json_util.h>
#include <grpc/support/log.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/bash_completion.h"
#include "client/report_format.h"
#include "client/step_trace.h"
#include "client/table.h"
#include "client/weightbeam/controller_client.h"
#include "common/engines/dry_run.h"
#include "common/planner/plan.h"
#include "common/planner/plan_proto.h"
#include "common/planner/relay.h"
#include "common/version/build_info.h"
#include "common/wire/state_words.h"

namespace v1 = weightbeam::v1;
using wb::client::HumanBytes;
using wb::client::Table;

namespace {

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return wb::wire::JsonWithStateWords(out);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "wbctl: %s\n", std::string(s.message()).c_str());
  return 2;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::InvalidArgumentError("cannot write " + path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return absl::InternalError("cannot write " + path);
  return absl::OkStatus();
}

}  // namespace

// The relay tree of a dry-run plan (planner/relay.h): the predictions, then per forwarding agent
// its parent, children and what it forwards; as a table, or as JSON with `json`.
std::string RelayReport(const std::vector<wb::planner::AgentLayout>& agents,
                        const wb::planner::Plan& plan, bool json) {
  const wb::planner::RelayTree& r = plan.relay;
  std::string rows;
  wb::client::Table t({"relay", "fed by", "forwards to", "bytes", "ops"});
  for (size_t a = 0; a < agents.size(); ++a) {
    const std::vector<int32_t> children = wb::planner::RelayChildren(plan, a);
    if (children.empty()) continue;
    const int32_t parent = wb::planner::RelayParent(plan, a);
    const std::string from = parent < 0 ? "senders" : agents[parent].name;
    std::string to, to_json;
    for (int32_t c : children) {
      absl::StrAppend(&to, to.empty() ? "" : " ", agents[c].name);
      absl::StrAppend(&to_json, to_json.empty() ? "" : ",", "\"", agents[c].name, "\"");
    }
    t.Add({agents[a].name, from, to, wb::client::HumanBytes(r.relay_send_bytes[a]),
           absl::StrCat(r.relay_send_ops[a])});
    absl::StrAppend(&rows, rows.empty() ? "" : ",", "{\"agent\":\"", agents[a].name,
                    "\",\"fed_by\":\"", from, "\",\"children\":[", to_json,
                    "],\"bytes\":", r.relay_send_bytes[a], ",\"ops\":", r.relay_send_ops[a], "}");
  }
  if (json) {
    return absl::StrCat("{\"roots\":", r.roots, ",\"fanout\":", r.fanout, ",\"depth\":", r.depth,
                        ",\"predicted_without_relays_seconds\":", r.direct_predicted_seconds,
                        ",\"predicted_seconds\":", r.predicted_seconds,
                        ",\"receiver_limit_seconds\":", r.receiver_limit_seconds,
                        ",\"relayed_bytes\":", r.relayed_bytes, ",\"agents\":[", rows, "]}");
  }
  if (r.roots == 0) {
    return absl::StrFormat(
        "relays: none (predicted %.4g s without them, receivers' limit %.4g s: relaying would "
        "not make the step faster)",
        r.direct_predicted_seconds, r.receiver_limit_seconds);
  }
  return absl::StrFormat(
      "relays: %d replica(s) per family fed by the senders, fan-out %d, depth %d; predicted "
      "%.4g s with relays, %.4g s without, receivers' limit %.4g s; %s relayed\n%s",
      r.roots, r.fanout, r.depth, r.predicted_seconds, r.direct_predicted_seconds,
      r.receiver_limit_seconds, wb::client::HumanBytes(r.relayed_bytes), t.Render());
}

// `wbctl plan --dry-run`: the planner on layouts built from config.json (common/engines).
int DryRunPlan(const std::string& model_path, const std::string& engine_name,
               const std::string& trainer_dialect, wb::engines::DeploymentOptions options,
               bool relays, bool json) {
  auto dialect = wb::engines::ParseTrainerDialect(trainer_dialect);
  if (!dialect.ok()) return Fail(dialect.status());
  options.trainer = *dialect;
  if (options.trainer == wb::engines::TrainerDialect::kMegatron) {
    const auto& m = options.megatron;
    options.trainers = m.tp * m.pp * m.dp;
  }
  if (model_path.empty()) return Fail(absl::InvalidArgumentError("--dry-run needs --model"));
  auto config = wb::engines::LoadModelConfig(model_path);
  if (!config.ok()) return Fail(config.status());
  auto engine = wb::engines::ParseEngine(engine_name);
  if (!engine.ok()) return Fail(engine.status());
  options.engine = *engine;
  // Repeating replicas held once, as the controller holds them: the same plan, less memory.
  options.mirror_replicas = true;
  auto layouts = wb::engines::DeploymentLayouts(*config, options);
  if (!layouts.ok()) return Fail(layouts.status());
  wb::planner::FoldMirrors(&*layouts);  // what the layouts' own mirrors leave
  wb::planner::PlanOptions plan_options;
  plan_options.cost.nic_gbps = options.nic_gbps;
  plan_options.relays.enabled = relays;
  auto plan = wb::planner::BuildPlan(*layouts, plan_options);
  if (!plan.ok()) return Fail(plan.status());
  // The JSON line always carries the relays as JSON; the tables above it show them as text.
  const std::string relay_json = relays ? RelayReport(*layouts, *plan, /*json=*/true) : "";
  v1::PlanSummary summary = wb::planner::SummaryToProto(*layouts, *plan, 0);
  std::vector<wb::engines::NicLoad> nics = wb::engines::SenderNicLoads(*layouts, *plan);
  std::string nic_json;
  wb::client::Table t({"sender", "nic", "bytes", "ops"});
  for (const auto& n : nics) {
    absl::StrAppend(&nic_json, nic_json.empty() ? "" : ",", "{\"agent\":\"", n.agent,
                    "\",\"nic\":\"", n.nic, "\",\"bytes\":", n.bytes, ",\"ops\":", n.ops, "}");
    t.Add({n.agent, n.nic, wb::client::HumanBytes(n.bytes), absl::StrCat(n.ops)});
  }
  const std::string out = absl::StrCat(
      "{\"model\":\"", model_path, "\",\"engine\":\"", engine_name, "\",\"trainer\":\"",
      trainer_dialect, "\",\"plan\":", Json(summary), ",\"sender_nics\":[", nic_json, "]",
      relays ? absl::StrCat(",\"relays\":", relay_json) : "", "}");
  if (!json) {
    std::printf(
        "dry run: %s on %s, %d %s trainers -> %d inference GPUs (tp %d, ep %d, %s)\n%s\n%s\n",
        model_path.c_str(), engine_name.c_str(), options.trainers, trainer_dialect.c_str(),
        options.inference_gpus, options.tp, options.ep, options.fp8 ? "fp8" : "bf16",
        wb::client::FormatPlan(summary).c_str(), t.Render().c_str());
    if (relays) std::printf("%s\n", RelayReport(*layouts, *plan, /*json=*/false).c_str());
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

int main(int argc, char** argv) {
  // gRPC logs failed TLS handshakes on stderr; wbctl reports every failure in one line itself.
  gpr_set_log_function([](gpr_log_func_args*) {});
  CLI::App app{"wbctl: inspect and drive a weightbeam cluster"};
  app.require_subcommand(1);
  // Global flags are accepted after the subcommand too (`wbctl plan --dry-run ... --json`): every
  // subcommand added below hands the options it does not know to the app.
  app.fallthrough();
  std::string controller;
  bool json = false;
  const char* env = std::getenv("WB_CONTROLLER");
  controller = env ? env : "127.0.0.1:7100";
  app.add_option("--controller", controller,
                 "controller host:port, or every controller of a high-availability election "
                 "comma-separated (default: $WB_CONTROLLER or 127.0.0.1:7100)");
  app.add_flag("--json", json, "print JSON instead of tables");
  auto security = wb::client::ControllerClient::Security::FromEnvironment();
  app.add_option("--ca", security.ca_file,
                 "CA file that signed the controller's certificate: TLS (default: $WB_TLS_CA)");
  app.add_option("--cert", security.cert_file,
                 "our certificate, for mutual TLS (default: $WB_TLS_CERT)");
  app.add_option("--key", security.key_file, "our certificate's key (default: $WB_TLS_KEY)");
  app.add_option("--token-file", security.token_file,
                 "file holding the controller's call token (default: $WB_TOKEN_FILE)");
  app.add_option("--server-name", security.server_name,
                 "name expected in the controller's certificate (default: $WB_TLS_SERVER_NAME "
                 "or the host)");

  auto* status = app.add_subcommand("status", "controller, agents, plan and recent steps");
  auto* agents = app.add_subcommand("agents", "the agents and their state");
  auto* tensors = app.add_subcommand("tensors", "registered tensors");
  std::string agent_filter;
  tensors->add_option("--agent", agent_filter, "only this agent's tensors");
  auto* plan = app.add_subcommand("plan", "the current plan (--create computes one)");
  bool create = false;
  uint32_t wait_ms = 30000;
  plan->add_flag("--create", create, "plan now (waits for the configured world)");
  plan->add_option("--wait-ms", wait_ms, "how long --create waits for the world");
  std::string delta_choice = "config";
  plan->add_option("--delta", delta_choice,
                   "with --create: delta mode on | off for this plan and later ones, or as the "
                   "controller's config says")
      ->check(CLI::IsMember({"on", "off", "config"}));
  // Dry run: plan a deployment from a model's config.json, no cluster needed.
  bool dry_run = false;
  std::string model_path, engine_name = "vllm";
  wb::engines::DeploymentOptions deployment;
  plan->add_flag("--dry-run", dry_run,
                 "plan from --model config.json without a cluster (bytes, ops, predicted time)");
  plan->add_option("--model", model_path, "the model's Hugging Face config.json (--dry-run)");
  plan->add_option("--engine", engine_name, "vllm | sglang (--dry-run)")
      ->check(CLI::IsMember({"vllm", "sglang"}));
  plan->add_option("--trainers", deployment.trainers, "training GPUs, FSDP (--dry-run)");
  std::string trainer_dialect = "fsdp";
  plan->add_option("--trainer", trainer_dialect,
                   "fsdp | megatron: the trainers' layout (--dry-run)")
      ->capture_default_str();
  plan->add_option("--trainer-tp", deployment.megatron.tp, "megatron tensor parallel (--dry-run)");
  plan->add_option("--trainer-pp", deployment.megatron.pp, "megatron pipeline stages (--dry-run)");
  plan->add_option("--trainer-ep", deployment.megatron.ep, "megatron expert parallel (--dry-run)");
  plan->add_option("--trainer-etp", deployment.megatron.etp,
                   "megatron expert tensor parallel (--dry-run)");
  plan->add_option("--trainer-stage-layers", deployment.stage_layer_counts,
                   "megatron layers per stage, comma-separated (uneven pipeline; --dry-run)")
      ->delimiter(',');
  plan->add_option("--trainer-dp", deployment.megatron.dp,
                   "megatron data-parallel copies, each a source (--dry-run)");
  plan->add_option("--inference-gpus", deployment.inference_gpus, "inference GPUs (--dry-run)");
  plan->add_option("--tp", deployment.tp, "tensor-parallel size of the engine (--dry-run)");
  plan->add_option("--ep", deployment.ep, "expert-parallel size of the engine (--dry-run)");
  plan->add_flag("--fp8", deployment.fp8, "FP8 128x128-block destinations (--dry-run)");
  plan->add_option("--nic-gbps", deployment.nic_gbps, "GB/s per NIC rail (--dry-run)");
  bool relays = false;
  plan->add_flag("--relays", relays,
                 "let later inference replicas take their bytes from earlier ones where the "
                 "cost model predicts a faster step (--dry-run; the tree and what each relay "
                 "forwards)");
  auto* step = app.add_subcommand("step", "push a new version to the inference side");
  uint64_t version = 0;
  step->add_option("VERSION", version, "the version to commit (newer than the last)")->required();
  int64_t max_staleness = -1;
  step->add_option("--max-staleness", max_staleness,
                   "wait (within the step timeout) until no inference replica left out would be "
                   "more than this many versions behind (docs/elastic.md)");
  std::vector<std::string> step_changed;
  step->add_option("--changed", step_changed,
                   "a partial step: only tensors matching this pattern changed (repeatable; "
                   "'*' wildcards; dense plans without relays)");
  std::string step_trace_file;
  step->add_option("--trace", step_trace_file,
                   "also write the step as a Chrome/Perfetto trace (JSON) to this file");
  auto* rollback = app.add_subcommand(
      "rollback", "make inference replicas live at a kept earlier version again (one local copy)");
  uint64_t rollback_to = 0;
  rollback->add_option("VERSION", rollback_to, "a version the replicas keep")->required();
  std::vector<int32_t> rollback_replicas;
  rollback->add_option("--replica", rollback_replicas, "only this replica (repeatable)");
  auto* trace = app.add_subcommand(
      "trace", "write the controller's recent steps as a Chrome/Perfetto trace (JSON)");
  std::string trace_file;
  trace->add_option("FILE", trace_file, "where to write the trace")->required();
  int trace_last = 10;
  trace->add_option("--last", trace_last, "this many of the most recent steps (default 10)")
      ->check(CLI::PositiveNumber);
  auto* watch = app.add_subcommand("watch", "print step results as they happen");
  int count = 0;
  watch->add_option("--count", count, "stop after this many steps (0: forever)");
  auto* version_cmd = app.add_subcommand("version", "print wbctl's version and git commit");
  auto* completion = app.add_subcommand("completion", "print a shell completion script");
  std::string shell;
  completion->add_option("SHELL", shell, "bash")->required()->check(CLI::IsMember({"bash"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; a usage error is CLI11's message and exit code 64 (EX_USAGE),
    // apart from 1 (nothing to show) and 2 (the command failed): docs/cli.md.
    return app.exit(e) == 0 ? 0 : 64;
  }

  if (*completion) {
    wb::client::CompletionHints hints;
    hints.choices = {{"--engine", {"vllm", "sglang"}},
                     {"--delta", {"on", "off", "config"}},
                     {"completion", {"bash"}}};
    hints.file_flags = {"--ca", "--cert", "--key", "--token-file", "--model", "--trace", "trace"};
    std::printf("%s", wb::client::BashCompletion(app, "wbctl", hints).c_str());
    return 0;
  }

  if (*version_cmd) {
    if (json) {
      std::printf("{\"program\":\"wbctl\",\"version\":\"%s\",\"commit\":\"%s\"}\n",
                  wb::version::Number(), wb::version::Commit());
    } else {
      std::printf("%s\n", wb::version::Line("wbctl").c_str());
    }
    return 0;
  }

  if (*plan && dry_run) {
    try {
      return DryRunPlan(model_path, engine_name, trainer_dialect, deployment, relays, json);
    } catch (const std::bad_alloc&) {
      return Fail(absl::ResourceExhaustedError(
          "out of memory planning this deployment; plan fewer GPUs or a smaller model"));
    }
  }

  auto client = wb::client::ControllerClient::Connect(controller, security);
  if (!client.ok()) return Fail(client.status());

  if (*status || *agents) {
    auto s = client->Status();
    if (!s.ok()) return Fail(s.status());
    if (json) {
      std::printf("%s\n", Json(*s).c_str());
      return 0;
    }
    if (*status) {
      std::printf("controller %s  version %s  last committed %llu%s\n", controller.c_str(),
                  s->version().c_str(),
                  static_cast<unsigned long long>(s->last_committed_version()),
                  s->layout_changed() ? "  (layout changed since the plan)" : "");
      if (std::string l = wb::client::FormatLeadership(*s); !l.empty()) {
        std::printf("%s", l.c_str());
      }
    }
    Table t({"AGENT", "STATE", "ENDPOINT", "TENSORS", "NICS", "LAST HEARTBEAT"});
    for (const auto& a : s->agents()) {
      std::vector<std::string> nics;
      for (const auto& n : a.info().nics()) nics.push_back(n.transport() + ":" + n.name());
      t.Add({a.info().name(), wb::wire::StateWord(a.state()), a.info().control_endpoint(),
             std::to_string(a.tensors()), absl::StrJoin(nics, ","),
             absl::StrCat(a.last_heartbeat_ms_ago(), " ms ago")});
    }
    std::printf("%s", t.Render().c_str());
    if (*status) {
      if (std::string r = wb::client::FormatReplicas(*s); !r.empty()) {
        std::printf("\n%s", r.c_str());
      }
      if (s->has_plan())
        std::printf("\n%s", wb::client::FormatPlan(s->plan()).c_str());
      else
        std::printf("\nno plan yet\n");
      for (const auto& r : s->recent_steps())
        std::printf("\n%s", wb::client::FormatStep(r).c_str());
    }
    return 0;
  }
  if (*tensors) {
    auto r = client->ListTensors(agent_filter);
    if (!r.ok()) return Fail(r.status());
    if (json) {
      std::printf("%s\n", Json(*r).c_str());
      return 0;
    }
    Table t({"AGENT", "TENSOR", "DTYPE", "SHAPE", "SHARD", "OWNER", "BYTES", "WHERE"});
    for (const auto& l : r->layouts()) {
      for (const auto& tl : l.tensors()) {
        std::vector<std::string> shard;
        for (const auto& d : tl.spec().shard()) {
          shard.push_back(absl::StrCat(d.start(), ":", d.start() + d.size()));
        }
        std::string owner =
            tl.owner().role() == v1::ROLE_TRAINER
                ? absl::StrCat("trainer ", tl.owner().rank())
                : absl::StrCat("replica ", tl.owner().replica(), " rank ", tl.owner().rank());
        std::string dtype = v1::DType_Name(tl.spec().dtype()).substr(6);
        t.Add({l.agent(), tl.spec().name(), dtype,
               "[" + absl::StrJoin(tl.spec().global_shape(), ",") + "]",
               shard.empty() ? "full" : "[" + absl::StrJoin(shard, ",") + "]", owner,
               HumanBytes(tl.region().length()), tl.location()});
      }
    }
    std::printf("%s", t.Render().c_str());
    return 0;
  }
  if (*plan) {
    v1::PlanSummary summary;
    if (create) {
      auto p = client->Plan(v1::ExpectedWorld(), std::chrono::milliseconds(wait_ms),
                            delta_choice == "on"    ? v1::DELTA_CHOICE_ON
                            : delta_choice == "off" ? v1::DELTA_CHOICE_OFF
                                                    : v1::DELTA_CHOICE_CONFIG);
      if (!p.ok()) return Fail(p.status());
      summary = *p;
    } else {
      auto s = client->Status();
      if (!s.ok()) return Fail(s.status());
      if (!s->has_plan()) {
        std::fprintf(stderr, "wbctl: no plan yet (run `wbctl plan --create` or a step)\n");
        return 1;
      }
      summary = s->plan();
    }
    std::printf("%s",
                json ? (Json(summary) + "\n").c_str() : wb::client::FormatPlan(summary).c_str());
    if (!json && summary.delta().enabled()) {
      // Delta mode: what the recent steps sent against their dense bytes.
      auto s = client->Status();
      if (s.ok()) std::printf("%s", wb::client::FormatDeltaHistory(s->recent_steps()).c_str());
    }
    return 0;
  }
  if (*rollback) {
    auto r = client->Rollback(rollback_to, rollback_replicas);
    if (!r.ok()) return Fail(r.status());
    std::printf("%s", json ? (Json(*r) + "\n").c_str() : wb::client::FormatStep(*r).c_str());
    return 0;
  }
  if (*step) {
    std::atomic<bool> done{false};
    std::thread progress;
    if (!json && isatty(2)) {
      progress = std::thread([&] {
        const auto t0 = std::chrono::steady_clock::now();
        while (!done) {
          double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::fprintf(stderr, "\rstep %llu running... %.1f s", (unsigned long long)version, s);
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        std::fprintf(stderr, "\r\033[K");
      });
    }
    std::optional<uint32_t> bound;
    if (max_staleness >= 0) bound = static_cast<uint32_t>(max_staleness);
    auto r = client->Step(version, {}, bound, step_changed);
    done = true;
    if (progress.joinable()) progress.join();
    if (!r.ok()) return Fail(r.status());
    std::printf("%s", json ? (Json(*r) + "\n").c_str() : wb::client::FormatStep(*r).c_str());
    if (!step_trace_file.empty()) {
      if (auto s = WriteFile(step_trace_file, wb::client::StepTraceJson({*r})); !s.ok()) {
        return Fail(s);
      }
    }
    return 0;
  }
  if (*trace) {
    auto s = client->Status();
    if (!s.ok()) return Fail(s.status());
    std::vector<v1::StepResult> steps(s->recent_steps().begin(), s->recent_steps().end());
    if (steps.empty()) {
      std::fprintf(stderr, "wbctl: no steps yet\n");
      return 1;
    }
    if (static_cast<int>(steps.size()) > trace_last) {
      steps.erase(steps.begin(), steps.end() - trace_last);
    }
    if (auto w = WriteFile(trace_file, wb::client::StepTraceJson(steps)); !w.ok()) return Fail(w);
    std::printf(
        "%s: %zu step(s), versions %llu-%llu (open in ui.perfetto.dev or chrome://tracing)\n",
        trace_file.c_str(), steps.size(), static_cast<unsigned long long>(steps.front().version()),
        static_cast<unsigned long long>(steps.back().version()));
    return 0;
  }
  if (*watch) {
    int seen = 0;
    auto s = client->WatchSteps([&](const v1::StepResult& r) {
      std::printf("%s", json ? (Json(r) + "\n").c_str() : wb::client::FormatStep(r).c_str());
      std::fflush(stdout);
      return count == 0 || ++seen < count;
    });
    if (!s.ok()) return Fail(s);
    return 0;
  }
  return 0;
}
