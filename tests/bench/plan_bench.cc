// Planner benchmark: generates a model's trainer and inference layouts, plans the transfer
// and prints one JSON line (time, peak memory, ops, bytes per sender/receiver, prediction).
#include <stdlib.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "common/engines/dry_run.h"
#include "common/planner/delta_model.h"
#include "common/planner/models.h"
#include "common/planner/plan.h"
#include "common/planner/relay.h"

namespace {

double CpuSeconds() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

uint64_t PeakRssBytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // KiB on Linux
}

void MinMeanMax(const std::vector<uint64_t>& v, const char* prefix, nlohmann::json* out) {
  double mn = v.empty() ? 0 : *std::min_element(v.begin(), v.end());
  double mx = v.empty() ? 0 : *std::max_element(v.begin(), v.end());
  double sum = 0;
  for (uint64_t x : v) sum += x;
  (*out)[std::string(prefix) + "_min"] = mn;
  (*out)[std::string(prefix) + "_mean"] = v.empty() ? 0 : sum / v.size();
  (*out)[std::string(prefix) + "_max"] = mx;
}

// Megatron trainers: the senders grouped by pipeline stage. Every byte of a stage's layers is held
// by that stage's ranks only, so the stage split fixes how much each stage sends; the planner
// decides only how a stage's bytes spread over its ranks (its data-parallel copies).
//   stage_sender_imbalance: max over stages of max / mean send bytes among the stage's ranks
//   stage_bound_imbalance: the smallest global sender imbalance any plan can reach with this
//     split (the busiest stage's bytes spread evenly over its ranks, over the global mean)
void StageImbalance(const wb::planner::PlanStats& s, const wb::engines::MegatronOptions& m,
                    int gpus_per_agent, nlohmann::json* out) {
  std::vector<std::vector<uint64_t>> stage(m.pp);
  double total = 0;
  uint64_t ranks = 0;
  for (int r = 0; r < m.tp * m.pp * m.dp; ++r) {
    const int agent = r / gpus_per_agent, gpu = r % gpus_per_agent;
    const size_t dev = static_cast<size_t>(s.agent_device_base[agent] + gpu + 1);
    const uint64_t bytes = dev < s.device_send_bytes.size() ? s.device_send_bytes[dev] : 0;
    stage[(r / m.tp) % m.pp].push_back(bytes);
    total += bytes;
    ++ranks;
  }
  double worst = 0, busiest = 0;
  std::vector<double> per_stage;
  for (const auto& v : stage) {
    double sum = 0, mx = 0;
    for (uint64_t b : v) sum += b, mx = std::max<double>(mx, b);
    per_stage.push_back(sum > 0 ? std::round(mx / (sum / v.size()) * 1000) / 1000 : 0);
    worst = std::max(worst, per_stage.back());
    busiest = std::max(busiest, sum / v.size());
  }
  (*out)["stage_sender_imbalances"] = per_stage;
  (*out)["stage_sender_imbalance"] = worst;
  (*out)["stage_bound_imbalance"] = total > 0 ? busiest / (total / ranks) : 0;
}

}  // namespace

// A partial step (StepRequest.changed) on this plan: every k-th trainer tensor name changed (k =
// round(1 / fraction), names sorted, so the choice spreads over the layers); the ops and bytes
// the senders then execute (ExecuteRequest.only_tensors) against the whole plan's.
void PartialStep(const wb::planner::Plan& plan, const std::vector<wb::planner::AgentLayout>& agents,
                 double fraction, nlohmann::json* j) {
  std::vector<std::string> names;
  for (size_t a = 0; a < plan.ops.size(); ++a) {
    for (const auto& op : plan.ops[a]) {
      names.push_back(wb::planner::EntryHolder(agents, op.src_agent).tensors[op.src_tensor].name);
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  const size_t every = std::max<size_t>(1, static_cast<size_t>(std::lround(1.0 / fraction)));
  std::set<std::string> changed;
  for (size_t i = 0; i < names.size(); i += every) changed.insert(names[i]);
  uint64_t ops = 0, bytes = 0, dense_ops = 0, dense_bytes = 0;
  for (size_t a = 0; a < plan.ops.size(); ++a) {
    for (const auto& op : plan.ops[a]) {
      const uint64_t fan = op.fanout < 0 ? 1 : plan.fanout_size[op.fanout];
      const uint64_t b = op.DstBytes() * fan;
      dense_ops += fan;
      dense_bytes += b;
      const auto& t = wb::planner::EntryHolder(agents, op.src_agent).tensors[op.src_tensor];
      if (changed.count(t.name.str())) {
        ops += fan;
        bytes += b;
      }
    }
  }
  (*j)["partial_tensor_fraction"] = fraction;
  (*j)["partial_tensors_changed"] = changed.size();
  (*j)["partial_tensors"] = names.size();
  (*j)["partial_ops"] = ops;
  (*j)["partial_bytes"] = bytes;
  (*j)["partial_ops_fraction"] = dense_ops > 0 ? static_cast<double>(ops) / dense_ops : 0;
  (*j)["partial_bytes_fraction"] = dense_bytes > 0 ? static_cast<double>(bytes) / dense_bytes : 0;
}

int Run(int argc, char** argv) {
  CLI::App app{"weightbeam planner benchmark"};
  std::string model_name = "kimi-k2";
  wb::planner::TrainerOptions tr;
  wb::planner::InferenceOptions inf;
  wb::planner::PlanOptions opt;
  tr.ranks = 256;
  inf.gpus = 128;
  inf.tp = 8;
  inf.ep = 1;
  bool bf16 = false;
  app.add_option(
      "--model", model_name,
      "qwen3-0.6b | qwen3-235b | kimi-k2, or a Hugging Face config.json (engine layouts)");
  std::string engine_name = "vllm";
  app.add_option("--engine", engine_name, "with a config.json: vllm | sglang");
  app.add_option("--trainers", tr.ranks, "training GPUs");
  app.add_option("--trainer-replicas", tr.replicas, "data-parallel trainer replicas (HSDP)");
  app.add_option("--trainer-ep", tr.ep,
                 "expert-parallel groups per trainer replica (megatron: the ep size)");
  std::string trainer_dialect = "fsdp";
  // A delta step predicted from this plan (docs/performance.md): the changed fraction and the
  // rates the model assumes, stated in the output.
  wb::planner::DeltaModel delta_model;
  wb::engines::MegatronOptions megatron;
  app.add_option("--trainer", trainer_dialect, "with a config.json: fsdp | megatron");
  double partial_fraction = 0;
  app.add_option("--partial", partial_fraction,
                 "partial step: fraction of the trainer tensors changed (0: not reported)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--delta-changed", delta_model.changed_fraction,
                 "delta step prediction: fraction of elements changed per step")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--delta-encode-gbps", delta_model.encode_gbps,
                 "delta step prediction: dense GB/s compared per sending GPU (GPU encoder)")
      ->check(CLI::PositiveNumber);
  app.add_option("--delta-apply-gbps", delta_model.apply_gbps,
                 "delta step prediction: packed GB/s applied per receiving GPU")
      ->check(CLI::PositiveNumber);
  app.add_option("--trainer-tp", megatron.tp, "megatron tensor parallel");
  app.add_option("--trainer-pp", megatron.pp, "megatron pipeline stages");
  app.add_option("--trainer-etp", megatron.etp, "megatron expert tensor parallel");
  app.add_option("--trainer-dp", megatron.dp, "megatron data-parallel copies (each a source)");
  std::vector<int64_t> stage_layer_counts;
  app.add_option("--trainer-stage-layers", stage_layer_counts,
                 "megatron layers per stage, comma-separated (uneven pipeline)")
      ->delimiter(',');
  app.add_option("--inference-gpus", inf.gpus, "inference GPUs");
  app.add_option("--tp", inf.tp, "tensor-parallel ranks per inference replica");
  app.add_option("--ep", inf.ep, "expert-parallel groups per inference replica (divides tp)");
  app.add_flag("--bf16", bf16, "inference in BF16 instead of FP8");
  app.add_option("--gpus-per-node", tr.gpus_per_agent, "GPUs per agent (both sides)");
  app.add_option("--nics-per-node", tr.nics_per_agent, "NIC rails per agent (both sides)");
  app.add_option("--nic-gbps", opt.cost.nic_gbps, "GB/s per NIC rail");
  app.add_option("--op-overhead-us", opt.cost.op_overhead_us, "fixed cost per op")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--layers-per-phase", opt.layers_per_phase, "layers per barrier phase")
      ->check(CLI::Range(0, 100000));
  app.add_option("--threads", opt.threads, "planner threads (0: the machine's cores)")
      ->check(CLI::Range(0, 1024));
  bool no_mirrors = false;
  app.add_flag("--no-mirrors", no_mirrors,
               "hold every inference replica's entries (no replica mirrors; same plan)");
  bool no_fan_out = false;
  app.add_flag("--no-fan-out", no_fan_out, "one op per destination entry (the old plan)");
  app.add_flag("--relays", opt.relays.enabled,
               "let later inference replicas take their bytes from earlier ones (relay.h)");
  app.add_option("--relay-roots", opt.relays.roots,
                 "with --relays: replicas fed by the trainers (0: the cost model chooses)");
  app.add_option("--relay-fanout", opt.relays.fanout, "with --relay-roots: children per relay");
  int layers = 0;
  app.add_option("--layers", layers, "kimi-k2 / qwen3-*: override the layer count (model size)")
      ->check(CLI::Range(0, 100000));
  CLI11_PARSE(app, argc, argv);
  inf.fp8 = !bf16;
  inf.mirror_replicas = !no_mirrors;
  opt.fan_out = !no_fan_out;
  inf.gpus_per_agent = tr.gpus_per_agent;
  inf.nics_per_agent = tr.nics_per_agent;
  tr.nic_gbps = inf.nic_gbps = opt.cost.nic_gbps;
  opt.fusions = wb::planner::DefaultFusionRules();

  const bool from_config = absl::EndsWith(model_name, ".json");
  absl::StatusOr<wb::planner::ModelSpec> model = wb::planner::ModelSpec{model_name, 0, {}};
  absl::StatusOr<wb::engines::ModelConfig> config;
  if (from_config) {
    config = wb::engines::LoadModelConfig(model_name);
    if (!config.ok()) {
      std::cerr << config.status() << "\n";
      return 2;
    }
    opt.fusions.clear();  // engine parameters arrive as HF-named parts (views)
  } else {
    model = wb::planner::ModelByName(model_name);
    if (model.ok() && layers > 0) {  // the same model family, deeper or shallower
      if (model_name == "kimi-k2") {
        wb::planner::DeepSeekV3Config c = wb::planner::KimiK2();
        c.layers = layers;
        model = wb::planner::BuildDeepSeekV3(model_name, c);
      } else {
        wb::planner::Qwen3Config c =
            model_name == "qwen3-235b" ? wb::planner::Qwen3_235B_A22B() : wb::planner::Qwen3_0_6B();
        c.layers = layers;
        model = wb::planner::BuildQwen3(model_name, c);
      }
    }
  }
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<wb::planner::AgentLayout>> layouts;
  if (from_config) {
    auto engine = wb::engines::ParseEngine(engine_name);
    if (!engine.ok()) {
      std::cerr << engine.status() << "\n";
      return 2;
    }
    auto dialect = wb::engines::ParseTrainerDialect(trainer_dialect);
    if (!dialect.ok()) {
      std::cerr << dialect.status() << "\n";
      return 2;
    }
    wb::engines::DeploymentOptions d;
    d.engine = *engine;
    d.trainer = *dialect;
    d.trainers = tr.ranks;
    d.megatron = megatron;
    d.megatron.ep = tr.ep;
    d.stage_layer_counts = stage_layer_counts;
    if (d.trainer == wb::engines::TrainerDialect::kMegatron) {
      tr.ranks = d.trainers = megatron.tp * megatron.pp * megatron.dp;
    }
    d.inference_gpus = inf.gpus;
    d.tp = inf.tp;
    d.ep = inf.ep;
    d.fp8 = inf.fp8;
    d.gpus_per_agent = tr.gpus_per_agent;
    d.nics_per_agent = tr.nics_per_agent;
    d.nic_gbps = opt.cost.nic_gbps;
    d.mirror_replicas = !no_mirrors;
    layouts = wb::engines::DeploymentLayouts(*config, d);
    // Repeating replicas come as mirrors (mirror_replicas); fold whatever else repeats, as the
    // controller does.
    if (layouts.ok() && !no_mirrors) wb::planner::FoldMirrors(&*layouts);
  } else {
    layouts = wb::planner::BuildLayouts(*model, tr, inf);
  }
  if (!layouts.ok()) {
    std::cerr << layouts.status() << "\n";
    return 2;
  }
  auto t1 = std::chrono::steady_clock::now();
  const double cpu1 = CpuSeconds();
  auto plan = wb::planner::BuildPlan(*layouts, opt);
  const double cpu2 = CpuSeconds();
  auto t2 = std::chrono::steady_clock::now();
  if (!plan.ok()) {
    std::cerr << plan.status().message().substr(0, 4000) << "\n";
    return 1;
  }
  const wb::planner::PlanStats& s = plan->stats;
  std::vector<uint64_t> senders, receivers;
  uint64_t tensors = 0, held = 0, mirrors = 0;
  for (size_t a = 0; a < layouts->size(); ++a) {
    tensors += wb::planner::EntryCount(*layouts, static_cast<int32_t>(a));
    held += (*layouts)[a].tensors.size();
    mirrors += (*layouts)[a].IsMirror();
    if (s.is_sender[a]) senders.push_back(s.send_bytes[a]);
    if (s.is_receiver[a]) receivers.push_back(s.recv_bytes[a]);
  }
  nlohmann::json j;
  j["model"] = model_name;
  if (layers > 0) j["layers"] = layers;
  if (from_config) j["engine"] = engine_name;
  if (!from_config) j["params"] = model->Params();
  j["trainers"] = tr.ranks;
  j["trainer_replicas"] = tr.replicas;
  j["trainer_ep"] = tr.ep;
  if (from_config) j["trainer"] = trainer_dialect;
  if (trainer_dialect == "megatron") {
    j["trainer_tp"] = megatron.tp;
    j["trainer_pp"] = megatron.pp;
    j["trainer_etp"] = megatron.etp;
    j["trainer_dp"] = megatron.dp;
  }
  j["inference_gpus"] = inf.gpus;
  j["tp"] = inf.tp;
  j["ep"] = inf.ep;
  j["fp8"] = inf.fp8;
  j["tensor_entries"] = tensors;  // registered tensors in the whole deployment
  j["held_entries"] = held;       // held in memory: mirrors share their template's
  j["mirror_agents"] = mirrors;
  j["layout_seconds"] = std::chrono::duration<double>(t1 - t0).count();
  j["plan_seconds"] = std::chrono::duration<double>(t2 - t1).count();
  j["plan_cpu_seconds"] = cpu2 - cpu1;   // robust when other jobs share the cores
  j["peak_rss_bytes"] = PeakRssBytes();  // the whole process: layouts included
  j["peak_rss_mb"] = PeakRssBytes() / 1048576.0;
  j["ops"] = s.total_ops;      // executed (one per destination)
  j["plan_ops"] = s.plan_ops;  // held in the plan (fan-out ops once)
  j["fan_out"] = opt.fan_out;
  // The planner's threads: --threads, else the machine's cores (at most 8), as BuildPlan does.
  j["threads"] = opt.threads > 0 ? opt.threads
                                 : std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  j["total_bytes"] = s.total_bytes;
  j["phases"] = plan->phases;
  // Per sending / receiving GPU (the unit of the published figures).
  MinMeanMax(s.sender_device_bytes, "sender_bytes", &j);
  MinMeanMax(s.receiver_device_bytes, "receiver_bytes", &j);
  j["sender_imbalance"] = s.sender_device_imbalance;
  if (trainer_dialect == "megatron") StageImbalance(s, megatron, tr.gpus_per_agent, &j);

  // Per agent (node).
  MinMeanMax(senders, "agent_sender_bytes", &j);
  MinMeanMax(receivers, "agent_receiver_bytes", &j);
  j["agent_sender_imbalance"] = s.sender_imbalance;
  j["agent_receiver_imbalance"] = s.receiver_imbalance;
  j["nic_gbps"] = opt.cost.nic_gbps;
  j["predicted_step_seconds"] = s.predicted_step_seconds;
  j["link_limit_seconds"] = s.link_limit_seconds;
  j["predicted_over_link_limit"] =
      s.link_limit_seconds > 0 ? s.predicted_step_seconds / s.link_limit_seconds : 0;
  // Relays (--relays): the step without and with them against the receivers' limit, and the
  // tree the cost model chose (roots 0: none).
  const wb::planner::RelayTree& rt = plan->relay;
  j["relays"] = opt.relays.enabled;
  j["receiver_limit_seconds"] = rt.receiver_limit_seconds;
  j["predicted_without_relays_seconds"] = rt.direct_predicted_seconds;
  if (opt.relays.enabled) {
    j["predicted_with_relays_seconds"] = rt.predicted_seconds;
    j["predicted_over_receiver_limit"] =
        rt.receiver_limit_seconds > 0 ? rt.predicted_seconds / rt.receiver_limit_seconds : 0;
    j["relay_roots"] = rt.roots;
    j["relay_fanout"] = rt.fanout;
    j["relay_depth"] = rt.depth;
    j["relay_pipeline_delay_seconds"] = rt.pipeline_delay_seconds;
    j["relayed_bytes"] = rt.relayed_bytes;
    std::vector<uint64_t> forwarding;
    for (uint64_t b : rt.relay_send_bytes) {
      if (b > 0) forwarding.push_back(b);
    }
    j["relay_agents"] = forwarding.size();
    MinMeanMax(forwarding, "relay_agent_send_bytes", &j);
    uint64_t relay_ops = 0;
    for (uint64_t n : rt.relay_send_ops) relay_ops += n;
    j["relay_ops"] = relay_ops;
  }
  // A delta step on this plan, with the rates the model assumed (common/planner/delta_model.h).
  delta_model.element_bytes = inf.fp8 ? 1 : 2;
  const wb::planner::DeltaPrediction dp = wb::planner::PredictDeltaStep(s, delta_model);
  j["delta_changed_fraction"] = delta_model.changed_fraction;
  j["delta_assumed_encode_gbps"] = delta_model.encode_gbps;
  j["delta_assumed_apply_gbps"] = delta_model.apply_gbps;
  j["delta_packed_fraction"] = dp.packed_fraction;
  j["delta_encode_seconds"] = dp.encode_seconds;
  j["delta_send_seconds"] = dp.send_seconds;
  j["delta_apply_seconds"] = dp.apply_seconds;
  j["predicted_delta_step_seconds"] = dp.seconds;
  if (partial_fraction > 0) PartialStep(*plan, *layouts, partial_fraction, &j);
  // The machine, so that figures from different runs can be read side by side.
  j["cores"] = std::thread::hardware_concurrency();
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3) j["loadavg"] = {load[0], load[1], load[2]};
  j["plan_hash"] = plan->hash_hex;
  std::cout << j.dump() << std::endl;
  return 0;
}

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::cerr << "plan_bench: out of memory; plan fewer GPUs or a smaller model\n";
    return 2;
  }
}
