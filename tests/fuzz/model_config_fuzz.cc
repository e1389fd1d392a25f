// libFuzzer target for the config.json -> layout path (common/engines): what the agent's Local
// EngineLayout / SourceLayout RPCs, wbctl and the client helpers run on a config.json any local
// client may send. Input: one byte choosing the engine options (engine, tp, ep, fp8), then the
// config.json text. Invariants: nothing throws or crashes; a refused config names config.json;
// an accepted one stays inside the limits (every size field <= kMaxConfigSize, TensorBound <=
// kMaxConfigTensors), and every layout built from it holds no more tensors than TensorBound
// and only non-negative dims.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "absl/strings/match.h"
#include "common/engines/engine_layout.h"
#include "common/engines/model_config.h"

namespace {
[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "model_config_fuzz invariant violated: %s\n", what);
  __builtin_trap();
}

void Check(const wb::engines::ModelConfig& c) {
  using wb::engines::kMaxConfigSize;
  for (int64_t v : {c.hidden, c.intermediate, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab,
                    c.experts, c.moe_intermediate, c.q_lora_rank, c.kv_lora_rank,
                    c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.shared_experts}) {
    if (v < 0 || v > kMaxConfigSize) Fail("an accepted size field outside [0, kMaxConfigSize]");
  }
  if (wb::engines::TensorBound(c) > wb::engines::kMaxConfigTensors) {
    Fail("an accepted config past kMaxConfigTensors");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wb::engines;
  if (size < 1) return 0;
  const uint8_t choice = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    auto config = ParseModelConfig(text, "config.json");
    if (!config.ok()) {
      if (!absl::StartsWith(config.status().message(), "config.json")) {
        Fail("a refusal that does not name config.json");
      }
      return 0;
    }
    Check(*config);
    const uint64_t bound = TensorBound(*config);
    const auto sources = SourceTensors(*config);
    if (sources.size() > bound) Fail("more source tensors than TensorBound");
    EngineOptions o;
    o.engine = (choice & 1) ? Engine::kSglang : Engine::kVllm;
    o.tp = 1 << ((choice >> 1) & 3);  // 1, 2, 4, 8
    o.tp_rank = (choice >> 3) & 1 ? o.tp - 1 : 0;
    o.ep = (choice >> 4) & 1 ? o.tp : 1;
    o.ep_rank = o.ep > 1 ? o.tp_rank : 0;
    o.fp8 = (choice >> 5) & 1;
    auto params = EngineLayout(*config, o);
    if (!params.ok()) return 0;
    if (params->size() > bound) Fail("more engine parameters than TensorBound");
    for (const auto& p : *params) {
      for (int64_t d : p.shape) {
        if (d < 0) Fail("a negative dim in an engine parameter");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_config_fuzz: exception %s\n", e.what());
    Fail("an exception escaped");
  }
  return 0;
}
