// storage_bench: the storage path on a Qwen3-0.6B-shaped model (BF16, N(0, 0.02) synthetic
// weights, ~1% of elements changed per version as in RL steps): bytes written per version
// (anchor vs delta), publish and apply time, every applied version checked bit for bit against
// the source. With --token, manifests are signed and checked (HMAC-SHA256, SHA-256 of every file)
// as on agents with a storage token. Prints one JSON line.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/planner/models.h"
#include "daemon/storage/delta_store.h"
#include "daemon/storage/manifest_mac.h"
#include "tests/bench/bench_support.h"
#include "tests/demo/synthetic_weights.h"

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  CLI::App app{"storage_bench: bytes per version on the storage path"};
  int layers = 28, versions = 8, anchor_every = 4;
  std::string dir, token;
  app.add_option("--layers", layers, "transformer layers (28 is Qwen3-0.6B)");
  app.add_option("--versions", versions, "versions to publish and apply");
  app.add_option("--anchor-every", anchor_every, "a dense anchor every N versions");
  app.add_option("--dir", dir, "directory to write into (default: a fresh one under /tmp)");
  app.add_option("--token", token, "sign and check manifests keyed from this token");
  CLI11_PARSE(app, argc, argv);
  wb::planner::Qwen3Config cfg = wb::planner::Qwen3_0_6B();
  cfg.layers = layers;
  const wb::planner::ModelSpec model = wb::planner::BuildQwen3("qwen3-0.6b", cfg);
  bool own_dir = dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/wb-storage-bench-XXXXXX";
    dir = mkdtemp(tmpl);
  }

  // Sources (what the trainer holds) and destinations (the inference copy), whole tensors.
  std::vector<std::vector<uint16_t>> src(model.tensors.size()), dst(model.tensors.size());
  std::vector<wb::storage::ShardBuffer> sources, destinations;
  uint64_t dense = 0;
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    const auto& t = model.tensors[i];
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    src[i].resize(n);
    dst[i].resize(n);
    const uint64_t h = wb::demo::NameHash(t.name);
    for (uint64_t k = 0; k < n; ++k) src[i][k] = wb::demo::BaseValue(h, k);
    dense += n * 2;
    v1::TensorSpec spec;
    spec.set_name(t.name);
    spec.set_dtype(v1::DTYPE_BF16);
    for (int64_t d : t.shape) spec.add_global_shape(d);
    auto span = [](std::vector<uint16_t>& v) {
      return absl::MakeSpan(reinterpret_cast<uint8_t*>(v.data()), v.size() * 2);
    };
    sources.push_back({spec, 0, span(src[i]), i + 1});
    destinations.push_back({spec, 0, span(dst[i]), i + 1});
  }

  wb::storage::StoreOptions options;
  options.dir = dir;
  options.writer = "bench";
  options.anchor_every = anchor_every;
  if (!token.empty()) options.manifest_key = wb::storage::DeriveManifestKey(token);
  wb::storage::DeltaPublisher publisher(options);
  wb::storage::DeltaSubscriber subscriber(options);
  nlohmann::json rows = nlohmann::json::array();
  uint64_t delta_bytes = 0, deltas = 0, anchor_bytes = 0;
  bool verified = true;
  for (int v = 1; v <= versions; ++v) {
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      wb::demo::ApplyVersion(wb::demo::NameHash(model.tensors[i].name), src[i].size(), v, 0,
                             src[i].size(), src[i].data());
    }
    auto t0 = Clock::now();
    auto r = publisher.Publish(v, sources);
    auto t1 = Clock::now();
    if (!r.ok()) {
      std::fprintf(stderr, "publish %d: %s\n", v, std::string(r.status().message()).c_str());
      return 1;
    }
    wb::storage::PollResult applied = subscriber.Poll(destinations, {});
    auto t2 = Clock::now();
    if (applied.committed != std::vector<uint64_t>{static_cast<uint64_t>(v)}) {
      std::fprintf(stderr, "version %d was not applied: %s\n", v,
                   applied.refused.empty() ? "?" : applied.refused[0].second.c_str());
      return 1;
    }
    for (size_t i = 0; i < src.size(); ++i) verified &= src[i] == dst[i];
    if (r->anchor) {
      anchor_bytes = r->bytes_written;
    } else {
      delta_bytes += r->bytes_written;
      ++deltas;
    }
    rows.push_back({{"version", v},
                    {"kind", r->anchor ? "anchor" : "delta"},
                    {"bytes", r->bytes_written},
                    {"changed_elements", r->changed_elements},
                    {"publish_s", std::chrono::duration<double>(t1 - t0).count()},
                    {"apply_s", std::chrono::duration<double>(t2 - t1).count()}});
  }
  if (own_dir) std::filesystem::remove_all(dir);
  const double mean_delta = deltas ? static_cast<double>(delta_bytes) / deltas : 0;
  nlohmann::json out = {{"bench", "storage"},
                        {"model", "qwen3-0.6b"},
                        {"layers", layers},
                        {"signed", !token.empty()},
                        {"params", dense / 2},
                        {"dense_bytes", dense},
                        {"anchor_bytes", anchor_bytes},
                        {"mean_delta_bytes", static_cast<uint64_t>(mean_delta)},
                        {"dense_over_delta", mean_delta > 0 ? dense / mean_delta : 0},
                        {"verified", verified},
                        {"versions", rows}};
  wb::bench::AddMachineInfo(&out);
  std::printf("%s\n", out.dump().c_str());
  return verified ? 0 : 1;
}
