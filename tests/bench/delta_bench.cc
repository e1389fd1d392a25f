// delta_bench: delta mode on a Qwen3-0.6B-shaped model (BF16 -> BF16) with synthetic RL
// updates (Adam at lr 3e-6 on N(0, 0.02) weights, after --warmup optimizer steps). Runs the same
// steps twice through a real controller and two wb-agent processes over loopback tcp, once dense
// and once in delta mode, and prints one JSON line: the fraction of BF16 values that changed per
// step, bytes sent vs dense bytes, step times, and the codec's encode / apply throughput on this
// step's data.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "daemon/delta/delta_codec.h"
#include "daemon/delta/op_layout.h"
#include "tests/bench/bench_support.h"
#include "tests/support/cluster.h"
#include "tests/support/process.h"
#include "tests/support/synthetic_adam.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using Clock = std::chrono::steady_clock;

namespace {

using wb::bench::Die;

struct Tensor {
  std::string name;
  int64_t rows, cols;
  uint64_t elems() const { return rows * cols; }
};

// Qwen3-0.6B: hidden 1024, 16 query heads and 8 KV heads of 128, MLP 3072, vocab 151936,
// tied embeddings; `layers` of its 28.
std::vector<Tensor> QwenShapes(int layers, bool embedding) {
  std::vector<Tensor> t;
  if (embedding) t.push_back({"model.embed_tokens.weight", 151936, 1024});
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "self_attn.q_proj.weight", 2048, 1024});
    t.push_back({p + "self_attn.k_proj.weight", 1024, 1024});
    t.push_back({p + "self_attn.v_proj.weight", 1024, 1024});
    t.push_back({p + "self_attn.o_proj.weight", 1024, 2048});
    t.push_back({p + "self_attn.q_norm.weight", 1, 128});
    t.push_back({p + "self_attn.k_norm.weight", 1, 128});
    t.push_back({p + "mlp.gate_proj.weight", 3072, 1024});
    t.push_back({p + "mlp.up_proj.weight", 3072, 1024});
    t.push_back({p + "mlp.down_proj.weight", 1024, 3072});
    t.push_back({p + "input_layernorm.weight", 1, 1024});
    t.push_back({p + "post_attention_layernorm.weight", 1, 1024});
  }
  t.push_back({"model.norm.weight", 1, 1024});
  return t;
}

TensorInfo InfoOf(const Tensor& t) {
  if (t.rows == 1) return TensorInfo{t.name, v1::DTYPE_BF16, {t.cols}, {}};
  return TensorInfo{t.name, v1::DTYPE_BF16, {t.rows, t.cols}, {}};
}

struct Options {
  int layers = 4;
  bool embedding = true;
  int steps = 6;
  int warmup = 20;
  double lr = 3e-6;
};

struct RunResult {
  std::vector<v1::StepResult> steps;
  std::vector<double> changed_fraction;     // per step after the first
  std::vector<uint16_t> before_last, last;  // codec measurement data (a prefix)
};

// One run: a fresh cluster, trainer and inference registered from this process, `steps`
// steps with the same synthetic updates.
RunResult Run(const Options& o, const std::vector<Tensor>& tensors, bool delta,
              uint64_t codec_elems) {
  wb::testing::ClusterOptions copts;
  copts.extra_agent_yaml = "executor:\n  staging_watermark_bytes: 256MiB\n";
  copts.extra_controller_yaml = delta ? "delta:\n  enabled: true\n  anchor_every: 1000000\n" : "";
  wb::testing::Cluster cluster(wb::testing::Runfile(""), copts);
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.elems();
  auto tbuf = SharedBuffer::Create(total * 2, "delta-bench-trainer");
  auto ibuf = SharedBuffer::Create(total * 2, "delta-bench-inference");
  if (!tbuf.ok() || !ibuf.ok()) Die("cannot allocate shared memory");
  auto trainer = LocalSession::Connect(cluster.socket("trainer-node"), {v1::ROLE_TRAINER, 0, 0});
  auto inference =
      LocalSession::Connect(cluster.socket("inference-node"), {v1::ROLE_INFERENCE, 0, 0});
  if (!trainer.ok() || !inference.ok()) Die("cannot connect to the agents");
  std::vector<std::unique_ptr<wb::testing::SyntheticAdam>> adam;
  uint16_t* w = static_cast<uint16_t*>(tbuf->data());
  uint64_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    adam.push_back(std::make_unique<wb::testing::SyntheticAdam>(tensors[i].elems(), 0.02f, i + 1));
    // Mid-training, not a fresh optimizer: Adam's bias correction inflates the first updates.
    for (int k = 0; k < o.warmup; ++k) adam.back()->Step(static_cast<float>(o.lr));
    adam.back()->WriteBf16(w + off);
    for (auto* s : {&*trainer, &*inference}) {
      auto st = s->Register(InfoOf(tensors[i]), s == &*trainer ? *tbuf : *ibuf, off * 2,
                            tensors[i].elems() * 2);
      if (!st.ok()) Die(std::string(st.message()));
    }
    off += tensors[i].elems();
  }
  auto ctl = ControllerClient::Connect(cluster.controller_address());
  if (!ctl.ok()) Die("no controller");
  v1::ExpectedWorld world;
  world.set_trainer_ranks(1);
  world.set_inference_replicas(1);
  world.set_inference_ranks_per_replica(1);
  auto plan = ctl->Plan(world, std::chrono::seconds(60));
  if (!plan.ok()) Die(std::string(plan.status().message()));
  RunResult r;
  for (int s = 1; s <= o.steps; ++s) {
    if (s > 1) {
      if (s == o.steps) r.before_last.assign(w, w + codec_elems);
      uint64_t changed = 0;
      off = 0;
      for (size_t i = 0; i < tensors.size(); ++i) {
        adam[i]->Step(static_cast<float>(o.lr));
        changed += adam[i]->WriteBf16Counting(w + off);
        off += tensors[i].elems();
      }
      r.changed_fraction.push_back(static_cast<double>(changed) / total);
      std::fprintf(stderr, "step %d: %.4f of the BF16 values changed\n", s,
                   r.changed_fraction.back());
      if (s == o.steps) r.last.assign(w, w + codec_elems);
    }
    auto step = ctl->Step(s, std::chrono::milliseconds(300000));
    if (!step.ok()) Die(std::string(step.status().message()));
    if (std::memcmp(tbuf->data(), ibuf->data(), total * 2) != 0) {
      Die("step " + std::to_string(s) + ": the inference copy differs from the trainer's");
    }
    for (const auto& a : step->agents()) {
      std::fprintf(stderr,
                   "%s step %d: %llu of %llu bytes in %.3f s (sender %.3f s: prepare %.3f, "
                   "encode %.3f, write %.3f thread-s)\n",
                   delta ? "delta" : "dense", s, (unsigned long long)step->bytes(),
                   (unsigned long long)step->bytes_dense(), step->seconds(), a.seconds(),
                   a.stages().prepare_seconds(), a.encode_seconds(), a.stages().write_seconds());
    }
    r.steps.push_back(*step);
  }
  return r;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

}  // namespace

int main(int argc, char** argv) {
  wb::testing::StopChildrenOnSignals();  // a killed run leaves no daemons behind
  Options o;
  CLI::App app{"delta mode on a Qwen3-0.6B-shaped model with synthetic Adam updates"};
  app.add_option("--layers", o.layers, "decoder layers (28 is the real model)");
  app.add_option("--embedding", o.embedding, "include embed_tokens (151936 x 1024)");
  app.add_option("--steps", o.steps, "steps per run (the first is dense in both)");
  app.add_option("--lr", o.lr, "Adam learning rate");
  app.add_option("--warmup", o.warmup, "Adam steps before the first published version");
  CLI11_PARSE(app, argc, argv);
  if (o.steps < 2) Die("--steps must be at least 2");
  const auto tensors = QwenShapes(o.layers, o.embedding);
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.elems();
  const uint64_t codec_elems = std::min<uint64_t>(total, uint64_t{64} << 20) / 1024 * 1024;

  RunResult dense = Run(o, tensors, false, 0);
  RunResult delta = Run(o, tensors, true, codec_elems);

  // The codec on this step's data (one thread, as each agent prepare thread runs it).
  std::vector<uint8_t> shadow(
      reinterpret_cast<uint8_t*>(delta.before_last.data()),
      reinterpret_cast<uint8_t*>(delta.before_last.data()) + codec_elems * 2);
  auto t0 = Clock::now();
  auto enc = wb::delta::EncodeDelta(
      absl::MakeSpan(shadow),
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(delta.last.data()), codec_elems * 2), 2,
      1);
  const double encode_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!enc.ok() || enc->kind != wb::delta::DeltaEncoding::Kind::kPacked) Die("encode failed");
  v1::TransferOp op;
  op.set_rows(codec_elems / 1024);
  op.set_row_elems(1024);
  op.set_src_dtype(v1::DTYPE_BF16);
  op.set_dst_dtype(v1::DTYPE_BF16);
  op.set_transform(v1::TRANSFORM_COPY);
  const wb::delta::OpLayout layout = wb::delta::LayoutOf(op);
  std::vector<uint16_t> receiver = delta.before_last;
  t0 = Clock::now();
  auto applied = wb::delta::ApplyToDestination(
      enc->packed, layout, reinterpret_cast<uint8_t*>(receiver.data()), nullptr);
  const double apply_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!applied.ok() || receiver != delta.last) Die("apply failed");

  auto mean_after_first = [](const RunResult& r, auto field) {
    std::vector<double> v;
    for (size_t i = 1; i < r.steps.size(); ++i) v.push_back(field(r.steps[i]));
    return Mean(v);
  };
  const double sent = mean_after_first(delta, [](const v1::StepResult& s) { return s.bytes(); });
  const double dense_bytes =
      mean_after_first(delta, [](const v1::StepResult& s) { return s.bytes_dense(); });
  double agent_encode_s = 0, agent_encoded = 0;
  for (size_t i = 1; i < delta.steps.size(); ++i) {
    for (const auto& a : delta.steps[i].agents()) {
      agent_encode_s += a.encode_seconds();
      agent_encoded += a.bytes_dense();
    }
  }
  nlohmann::json j;
  j["bench"] = "delta_bench";
  wb::bench::AddMachineInfo(&j);
  j["model"] = "qwen3-0.6b-shaped";
  j["layers"] = o.layers;
  j["embedding"] = o.embedding;
  j["params"] = total;
  j["steps"] = o.steps;
  j["lr"] = o.lr;
  j["warmup"] = o.warmup;
  j["changed_fraction"] = Mean(delta.changed_fraction);
  j["changed_fraction_first"] = delta.changed_fraction.front();
  j["changed_fraction_last"] = delta.changed_fraction.back();
  j["bytes_sent"] = static_cast<uint64_t>(sent);
  j["bytes_dense"] = static_cast<uint64_t>(dense_bytes);
  j["reduction"] = sent > 0 ? dense_bytes / sent : 0;
  j["step_seconds_delta"] =
      mean_after_first(delta, [](const v1::StepResult& s) { return s.seconds(); });
  j["step_seconds_dense"] =
      mean_after_first(dense, [](const v1::StepResult& s) { return s.seconds(); });
  j["anchor_step_seconds"] = delta.steps[0].seconds();
  j["encode_gbps"] = codec_elems * 2 / encode_s / 1e9;
  j["apply_gbps"] = codec_elems * 2 / apply_s / 1e9;  // dense bytes patched per second
  j["codec_bytes"] = codec_elems * 2;
  j["agent_encode_gbps"] = agent_encode_s > 0 ? agent_encoded / agent_encode_s / 1e9 : 0;
  j["delta_ops"] = delta.steps.back().delta_ops();
  j["dense_ops"] = delta.steps.back().dense_ops();
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
