#include "common/engines/model_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace wb::engines {
namespace {

using Json = nlohmann::json;

struct Architecture {
  const char* name;
  Family family;
};

constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", Family::kDense},
    {"Qwen2ForCausalLM", Family::kDense},
    {"Qwen3ForCausalLM", Family::kDense},
    {"Qwen3MoeForCausalLM", Family::kMoe},
    // vLLM and SGLang load Mistral with their Llama model: the same parameters and names.
    {"MistralForCausalLM", Family::kDense},
    {"DeepseekV3ForCausalLM", Family::kDeepseek},  // also Kimi-K2
};

// Reads config fields, remembering the first problem so that the caller reports one error.
class Reader {
 public:
  Reader(const Json& json, absl::string_view source) : json_(json), source_(source) {}

  // A positive integer; `fallback` (when >= 0) if the key is absent or null.
  int64_t Positive(const char* key, int64_t fallback = -1) {
    auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) {
      if (fallback >= 0) return fallback;
      Fail(absl::StrCat("missing '", key, "' (a positive integer)"));
      return 0;
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      Fail(absl::StrCat("'", key, "' is ", it->dump(), ", expected a positive integer"));
      return 0;
    }
    return Capped(key, it->get<int64_t>());
  }

  int64_t NonNegative(const char* key) {
    auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return 0;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      Fail(absl::StrCat("'", key, "' is ", it->dump(), ", expected an integer >= 0"));
      return 0;
    }
    return Capped(key, it->get<int64_t>());
  }

  // Sizes past kMaxConfigSize are refused (layouts loop over layers and experts and multiply
  // sizes; beyond it no real model goes).
  int64_t Capped(const char* key, int64_t value) {
    if (value <= kMaxConfigSize) return value;
    Fail(absl::StrCat("'", key, "' is ", value, ", over the limit of ", kMaxConfigSize,
                      " (engines::kMaxConfigSize)"));
    return 0;
  }

  bool Bool(const char* key, bool fallback) {
    auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) {
      Fail(absl::StrCat("'", key, "' is ", it->dump(), ", expected true or false"));
      return fallback;
    }
    return it->get<bool>();
  }

  std::string String(const char* key) {
    auto it = json_.find(key);
    return it != json_.end() && it->is_string() ? it->get<std::string>() : "";
  }

  std::vector<int64_t> Ints(const Json& json, const char* key) {
    std::vector<int64_t> out;
    auto it = json.find(key);
    if (it == json.end() || it->is_null()) return out;
    if (!it->is_array()) {
      Fail(absl::StrCat("'", key, "' is ", it->dump(), ", expected a list of integers"));
      return out;
    }
    for (const Json& v : *it) {
      if (!v.is_number_integer()) {
        Fail(absl::StrCat("'", key, "' is ", it->dump(), ", expected a list of integers"));
        return {};
      }
      out.push_back(v.get<int64_t>());
    }
    return out;
  }

  void Fail(const std::string& what) {
    if (error_.empty()) error_ = absl::StrCat(source_, ": ", what);
  }
  const std::string& error() const { return error_; }

 private:
  const Json& json_;
  std::string source_;
  std::string error_;
};

}  // namespace

const char* FamilyName(Family family) {
  switch (family) {
    case Family::kDense:
      return "dense";
    case Family::kMoe:
      return "moe";
    case Family::kDeepseek:
      return "deepseek";
  }
  return "?";
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  switch (family) {
    case Family::kDense:
      return false;
    case Family::kMoe:
      return experts > 0 &&
             std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
                 mlp_only_layers.end() &&
             (layer + 1) % decoder_sparse_step == 0;
    case Family::kDeepseek:
      return experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  return false;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text, absl::string_view source) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  ModelConfig c;
  auto archs = json.find("architectures");
  if (archs != json.end() && archs->is_array() && !archs->empty() && archs->front().is_string()) {
    c.architecture = archs->front().get<std::string>();
  }
  const Architecture* arch = nullptr;
  for (const Architecture& a : kArchitectures) {
    if (c.architecture == a.name) arch = &a;
  }
  if (arch == nullptr) {
    std::vector<std::string> known;
    for (const Architecture& a : kArchitectures) known.push_back(a.name);
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unknown architecture '", c.architecture,
                     "' (field 'architectures'); known: ", absl::StrJoin(known, ", ")));
  }
  c.family = arch->family;
  Reader r(json, source);
  c.model_type = r.String("model_type");
  c.hidden = r.Positive("hidden_size");
  c.layers = r.Positive("num_hidden_layers");
  c.heads = r.Positive("num_attention_heads");
  c.kv_heads = r.Positive("num_key_value_heads", c.heads);
  c.vocab = r.Positive("vocab_size");
  c.tie_embeddings = r.Bool("tie_word_embeddings", false);
  c.intermediate = r.Positive("intermediate_size");
  if (c.family != Family::kDeepseek) {
    c.head_dim = r.Positive("head_dim", c.heads > 0 ? c.hidden / c.heads : 0);
    c.qkv_bias = c.architecture == "Qwen2ForCausalLM" || r.Bool("attention_bias", false);
    c.qk_norm = c.architecture == "Qwen3ForCausalLM" || c.family == Family::kMoe;
  }
  if (c.family == Family::kMoe) {
    // Transformers v5 writes num_local_experts (num_experts is its alias there).
    c.experts = json.contains("num_experts") || !json.contains("num_local_experts")
                    ? r.Positive("num_experts")
                    : r.Positive("num_local_experts");
    c.moe_intermediate = r.Positive("moe_intermediate_size");
    c.decoder_sparse_step = r.Positive("decoder_sparse_step", 1);
    c.mlp_only_layers = r.Ints(json, "mlp_only_layers");
  }
  if (c.family == Family::kDeepseek) {
    c.experts = r.Positive("n_routed_experts");
    c.moe_intermediate = r.Positive("moe_intermediate_size");
    c.first_k_dense_replace = r.NonNegative("first_k_dense_replace");
    c.moe_layer_freq = r.Positive("moe_layer_freq", 1);
    c.shared_experts = r.NonNegative("n_shared_experts");
    c.router_bias = r.String("topk_method") == "noaux_tc";
    c.q_lora_rank = r.Positive("q_lora_rank", 0);
    c.kv_lora_rank = r.Positive("kv_lora_rank");
    c.qk_nope_head_dim = r.Positive("qk_nope_head_dim");
    c.qk_rope_head_dim = r.Positive("qk_rope_head_dim");
    c.v_head_dim = r.Positive("v_head_dim");
  }
  auto quant = json.find("quantization_config");
  if (quant != json.end() && quant->is_object()) {
    c.weight_block_size = r.Ints(*quant, "weight_block_size");
    if (!c.weight_block_size.empty() && c.weight_block_size != std::vector<int64_t>{128, 128}) {
      r.Fail(absl::StrCat("quantization_config.weight_block_size is [",
                          absl::StrJoin(c.weight_block_size, ", "),
                          "]; weightbeam's FP8 destinations use [128, 128] blocks"));
    }
  }
  if (!r.error().empty()) return absl::InvalidArgumentError(r.error());
  if (const uint64_t n = TensorBound(c); n > kMaxConfigTensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": num_hidden_layers ", c.layers,
        c.experts > 0
            ? absl::StrCat(" with ",
                           c.family == Family::kDeepseek ? "n_routed_experts " : "num_experts ",
                           c.experts)
            : "",
        " make up to ", n, " tensors, over the limit of ", kMaxConfigTensors,
        " per model (engines::kMaxConfigTensors)"));
  }
  return c;
}

uint64_t TensorBound(const ModelConfig& c) {
  // Per layer: attention, norms and biases (16 at most), then either a dense MLP or the
  // router, every expert and the shared experts; each may come with an FP8 scale tensor.
  const uint64_t experts = static_cast<uint64_t>(std::max<int64_t>(c.experts, 0));
  const uint64_t per_layer = 16 + (experts > 0 ? 2 + 3 * experts + 3 : 3);
  const uint64_t layers = static_cast<uint64_t>(std::max<int64_t>(c.layers, 0));
  return 2 * (3 + layers * per_layer);  // sizes are capped: no overflow
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the model config"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseModelConfig(text.str(), path);
}

}  // namespace wb::engines
