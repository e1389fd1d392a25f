// The C++ registration helpers (client/weightbeam/engines.h) against a real controller and
// agents: a trainer registers a small Qwen3's HF tensors with RegisterHfShards, two vLLM TP
// ranks register their parameters with RegisterEngineParams; one step lands, and the fused /
// split parameters are checked byte for byte against a reference built here by plain loops
// from the trainer's pattern. A wrong destination length is refused, naming the parameter,
// with nothing registered. RegisterMegatronParams: Megatron TP-2 ranks into vLLM TP 1.
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/weightbeam/controller_client.h"
#include "client/weightbeam/engines.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "common/engines/engine_layout.h"
#include "common/engines/model_config.h"
#include "tests/support/cluster.h"
#include "tests/support/one_tensor.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Cluster;

namespace {

uint64_t Elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The trainer's value of element `i` of HF tensor `name` (a finite BF16 bit pattern).
uint16_t Pattern(const std::string& name, uint64_t i) {
  uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return static_cast<uint16_t>(0x3c00 + ((h + i * 7) & 0x3ff));
}

// A 2-D BF16 matrix held by the test, filled from the trainer pattern.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint16_t> v;
  uint16_t at(int64_t r, int64_t c) const { return v[r * cols + c]; }
};

Matrix Hf(const std::string& name, int64_t rows, int64_t cols) {
  Matrix m{rows, cols, std::vector<uint16_t>(rows * cols)};
  for (int64_t i = 0; i < rows * cols; ++i) m.v[i] = Pattern(name, i);
  return m;
}

// One rank's engine parameters packed in one SharedBuffer (held by pointer: the
// TensorMemory entries point at it and the EngineRank moves).
struct EngineRank {
  std::unique_ptr<SharedBuffer> buffer;
  std::map<std::string, TensorMemory> params;
  std::map<std::string, std::vector<int64_t>> shapes;
};

EngineRank Allocate(const std::vector<wb::engines::EngineParam>& layout) {
  uint64_t total = 0;
  for (const auto& p : layout) total += Elements(p.shape) * 2;
  auto b = SharedBuffer::Create(total, "engine");
  REQUIRE(b.ok());
  EngineRank r{std::make_unique<SharedBuffer>(std::move(*b)), {}, {}};
  uint64_t offset = 0;
  for (const auto& p : layout) {
    REQUIRE(p.dtype == v1::DTYPE_BF16);
    const uint64_t len = Elements(p.shape) * 2;
    r.params[p.name] = TensorMemory{r.buffer.get(), offset, nullptr, 0, len};
    r.shapes[p.name] = p.shape;
    offset += len;
  }
  return r;
}

// The parameter's bytes as a matrix.
Matrix Param(const EngineRank& r, const std::string& name) {
  const TensorMemory& m = r.params.at(name);
  const auto& shape = r.shapes.at(name);
  REQUIRE(shape.size() == 2);
  Matrix out{shape[0], shape[1], std::vector<uint16_t>(shape[0] * shape[1])};
  std::memcpy(out.v.data(), static_cast<const char*>(r.buffer->data()) + m.offset, m.length);
  return out;
}

}  // namespace

TEST_CASE("RegisterHfShards + RegisterEngineParams: a vLLM TP-2 step lands byte for byte") {
  auto config = wb::engines::LoadModelConfig("tests/python/engine_configs/qwen3.json");
  REQUIRE(config.ok());
  const int64_t H = config->hidden, Q = config->heads * config->head_dim,
                KV = config->kv_heads * config->head_dim, I = config->intermediate,
                V = config->vocab;

  wb::testing::ClusterOptions options;
  options.inference_ranks_per_replica = 2;
  Cluster cluster(wb::testing::Runfile(""), options);

  // The trainer: every HF tensor, whole (world 1), packed in one buffer, patterned.
  const auto sources = wb::engines::SourceTensors(*config);
  uint64_t trainer_bytes = 0;
  for (const auto& t : sources) trainer_bytes += Elements(t.shape) * 2;
  auto tbuf = SharedBuffer::Create(trainer_bytes, "trainer");
  REQUIRE(tbuf.ok());
  std::map<std::string, TensorMemory> shards;
  {
    uint64_t offset = 0;
    for (const auto& t : sources) {
      const uint64_t n = Elements(t.shape);
      shards[t.name] = TensorMemory{&*tbuf, offset, nullptr, 0, n * 2};
      offset += n * 2;
    }
  }
  auto trainer =
      LocalSession::Connect(cluster.socket("trainer-node"), Identity{v1::ROLE_TRAINER, 0, 0});
  REQUIRE(trainer.ok());
  {
    absl::Status s = RegisterHfShards(*trainer, shards, *config, 0, 1, 1);
    INFO(s.ToString());
    REQUIRE(s.ok());
  }

  // Two vLLM TP ranks of one replica.
  std::vector<EngineRank> ranks;
  std::vector<LocalSession> sessions;
  for (int r = 0; r < 2; ++r) {
    wb::engines::EngineOptions eo;
    eo.engine = wb::engines::Engine::kVllm;
    eo.tp = 2;
    eo.tp_rank = r;
    auto layout = wb::engines::EngineLayout(*config, eo);
    REQUIRE(layout.ok());
    ranks.push_back(Allocate(*layout));
    auto s =
        LocalSession::Connect(cluster.socket("inference-node"), Identity{v1::ROLE_INFERENCE, r, 0});
    REQUIRE(s.ok());
    sessions.push_back(std::move(*s));

    if (r == 0) {
      // A destination one row short, late in the order: refused by name, nothing registered
      // (the correct registration below would otherwise meet duplicates).
      const std::string bad = "model.layers.2.mlp.down_proj.weight";
      REQUIRE(ranks[0].params.count(bad) == 1);
      auto wrong = ranks[0].params;
      wrong[bad].length -= ranks[0].shapes.at(bad)[1] * 2;
      absl::Status s = RegisterEngineParams(sessions[0], wrong, *config, eo);
      REQUIRE_FALSE(s.ok());
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(s.message()), Catch::Contains(bad));
    }
    absl::Status s2 = RegisterEngineParams(sessions[r], ranks[r].params, *config, eo);
    INFO(s2.ToString());
    REQUIRE(s2.ok());
  }

  ControllerClient ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanWorld(&ctl, wb::testing::World(1, 1, 2));

  // Fill the trainer buffers with the pattern, then step.
  for (const auto& t : sources) {
    auto* p =
        reinterpret_cast<uint16_t*>(static_cast<char*>(tbuf->data()) + shards.at(t.name).offset);
    const uint64_t n = Elements(t.shape);
    for (uint64_t i = 0; i < n; ++i) p[i] = Pattern(t.name, i);
  }
  auto step = ctl.Step(1);
  INFO((step.ok() ? "" : std::string(step.status().message())));
  REQUIRE(step.ok());

  for (int r = 0; r < 2; ++r) {
    INFO("tp rank " << r);
    for (int layer : {0, 2}) {
      const std::string pre = "model.layers." + std::to_string(layer) + ".";
      INFO(pre);
      // qkv_proj: q rows [r*Q/2, (r+1)*Q/2), then k rows, then v rows of this rank.
      const Matrix q = Hf(pre + "self_attn.q_proj.weight", Q, H);
      const Matrix k = Hf(pre + "self_attn.k_proj.weight", KV, H);
      const Matrix v = Hf(pre + "self_attn.v_proj.weight", KV, H);
      Matrix want{Q / 2 + KV, H, {}};
      for (int64_t i = 0; i < Q / 2; ++i)
        for (int64_t c = 0; c < H; ++c) want.v.push_back(q.at(r * Q / 2 + i, c));
      for (const Matrix* m : {&k, &v})
        for (int64_t i = 0; i < KV / 2; ++i)
          for (int64_t c = 0; c < H; ++c) want.v.push_back(m->at(r * KV / 2 + i, c));
      const Matrix qkv = Param(ranks[r], pre + "self_attn.qkv_proj.weight");
      CHECK(qkv.rows == want.rows);
      CHECK(qkv.cols == want.cols);
      CHECK((qkv.v == want.v));

      // o_proj: columns [r*Q/2, (r+1)*Q/2) of o_proj (row-parallel).
      const Matrix o = Hf(pre + "self_attn.o_proj.weight", H, Q);
      Matrix want_o{H, Q / 2, {}};
      for (int64_t i = 0; i < H; ++i)
        for (int64_t c = 0; c < Q / 2; ++c) want_o.v.push_back(o.at(i, r * Q / 2 + c));
      CHECK((Param(ranks[r], pre + "self_attn.o_proj.weight").v == want_o.v));

      // gate_up_proj: gate rows [r*I/2, ...) then up rows.
      const Matrix g = Hf(pre + "mlp.gate_proj.weight", I, H);
      const Matrix u = Hf(pre + "mlp.up_proj.weight", I, H);
      Matrix want_gu{I, H, {}};
      for (const Matrix* m : {&g, &u})
        for (int64_t i = 0; i < I / 2; ++i)
          for (int64_t c = 0; c < H; ++c) want_gu.v.push_back(m->at(r * I / 2 + i, c));
      CHECK((Param(ranks[r], pre + "mlp.gate_up_proj.weight").v == want_gu.v));

      // q_norm is replicated: the whole HF vector on both ranks.
      const std::string qn = pre + "self_attn.q_norm.weight";
      const TensorMemory& m = ranks[r].params.at(qn);
      const auto* got = reinterpret_cast<const uint16_t*>(
          static_cast<const char*>(ranks[r].buffer->data()) + m.offset);
      for (int64_t i = 0; i < config->head_dim; ++i) CHECK(got[i] == Pattern(qn, i));
    }
    // embed_tokens: vocab rows of this rank's padded slice; the padding stays zero.
    const Matrix e = Param(ranks[r], "model.embed_tokens.weight");
    const int64_t per = e.rows;
    CHECK(per * 2 >= V);
    bool same = true;
    for (int64_t i = 0; i < per; ++i) {
      const int64_t row = r * per + i;
      for (int64_t c = 0; c < H; ++c) {
        const uint16_t want = row < V ? Pattern("model.embed_tokens.weight", row * H + c) : 0;
        same = same && e.at(i, c) == want;
      }
    }
    CHECK(same);
  }
}

// Megatron-core TP 2 trainer ranks (Qwen3: 4 query groups of 2 heads, 2 per rank) registered
// with RegisterMegatronParams, one vLLM TP-1 rank. The trainer memory of linear_qkv,
// linear_fc1 and linear_proj is filled here by Megatron's rules with plain loops (the other
// tensors from the layout's parts); the engine's fused parameters are checked byte for byte.
TEST_CASE("RegisterMegatronParams: Megatron TP-2 ranks land byte for byte in vLLM TP 1") {
  auto config = wb::engines::LoadModelConfig("tests/python/engine_configs/qwen3.json");
  REQUIRE(config.ok());
  const int64_t H = config->hidden, D = config->head_dim, NG = config->kv_heads,
                QPG = config->heads / config->kv_heads, Q = config->heads * D,
                I = config->intermediate;
  wb::testing::ClusterOptions options;
  options.trainer_ranks = 2;
  Cluster cluster(wb::testing::Runfile(""), options);

  std::vector<std::unique_ptr<SharedBuffer>> buffers;
  std::vector<LocalSession> trainers;
  for (int t = 0; t < 2; ++t) {
    wb::engines::MegatronOptions mo;
    mo.tp = 2;
    mo.tp_rank = t;
    auto layout = wb::engines::MegatronLayout(*config, mo);
    REQUIRE(layout.ok());
    uint64_t total = 0;
    for (const auto& p : *layout) total += Elements(p.shape) * 2;
    auto b = SharedBuffer::Create(total, "megatron");
    REQUIRE(b.ok());
    buffers.push_back(std::make_unique<SharedBuffer>(std::move(*b)));
    std::map<std::string, TensorMemory> params;
    uint64_t offset = 0;
    for (const auto& p : *layout) {
      const uint64_t len = Elements(p.shape) * 2;
      params[p.name] = TensorMemory{buffers.back().get(), offset, nullptr, 0, len};
      auto* mem = reinterpret_cast<uint16_t*>(static_cast<char*>(buffers.back()->data()) + offset);
      offset += len;
      const int64_t cols = p.shape.size() == 2 ? p.shape[1] : 1;
      auto row = [&](int64_t at, const std::string& hf, int64_t hf_row, int64_t hf_cols,
                     int64_t col0) {
        for (int64_t c = 0; c < cols; ++c)
          mem[at * cols + c] = Pattern(hf, hf_row * hf_cols + col0 + c);
      };
      const std::string layer = p.name.substr(0, p.name.find(".", 15) + 1);  // decoder.layers.N.
      const std::string hf = "model.layers." + layer.substr(15);
      if (absl::EndsWith(p.name, "linear_qkv.weight")) {
        int64_t at = 0;
        for (int64_t g = t * NG / 2; g < (t + 1) * NG / 2; ++g) {
          for (int64_t i = 0; i < QPG * D; ++i)
            row(at++, hf + "self_attn.q_proj.weight", g * QPG * D + i, H, 0);
          for (int64_t i = 0; i < D; ++i)
            row(at++, hf + "self_attn.k_proj.weight", g * D + i, H, 0);
          for (int64_t i = 0; i < D; ++i)
            row(at++, hf + "self_attn.v_proj.weight", g * D + i, H, 0);
        }
      } else if (absl::EndsWith(p.name, "mlp.linear_fc1.weight")) {
        for (int64_t i = 0; i < I / 2; ++i)
          row(i, hf + "mlp.gate_proj.weight", t * I / 2 + i, H, 0);
        for (int64_t i = 0; i < I / 2; ++i)
          row(I / 2 + i, hf + "mlp.up_proj.weight", t * I / 2 + i, H, 0);
      } else if (absl::EndsWith(p.name, "linear_proj.weight")) {
        for (int64_t i = 0; i < H; ++i) row(i, hf + "self_attn.o_proj.weight", i, Q, t * Q / 2);
      } else {
        for (const auto& part : p.parts) {  // not checked: filled from the layout
          for (int64_t i = 0; i < part.box[0].size; ++i) {
            const int64_t src_cols = part.box.size() == 2 ? part.source_shape[1] : 1;
            const int64_t n = part.box.size() == 2 ? part.box[1].size : 1;
            for (int64_t c = 0; c < n; ++c) {
              const int64_t c0 = part.box.size() == 2 ? part.box[1].start : 0;
              mem[(part.offset[0] + i) * cols + c] =
                  Pattern(part.source, (part.box[0].start + i) * src_cols + c0 + c);
            }
          }
        }
      }
    }
    auto s =
        LocalSession::Connect(cluster.socket("trainer-node"), Identity{v1::ROLE_TRAINER, t, 0});
    REQUIRE(s.ok());
    trainers.push_back(std::move(*s));
    if (t == 1) {
      // A tensor of a layer this stage does not hold: one error naming it, nothing registered.
      auto stray = params;
      stray["decoder.layers.7.mlp.linear_fc1.weight"] =
          params.at("decoder.layers.0.mlp.linear_fc1.weight");
      absl::Status bad = RegisterMegatronParams(trainers[t], stray, *config, mo);
      REQUIRE_FALSE(bad.ok());
      CHECK_THAT(std::string(bad.message()),
                 Catch::Contains("trainer tensor 'decoder.layers.7.mlp.linear_fc1.weight'"));
    }
    absl::Status ok = RegisterMegatronParams(trainers[t], params, *config, mo);
    INFO(ok.ToString());
    REQUIRE(ok.ok());
  }

  wb::engines::EngineOptions eo;
  eo.tp = 1;
  auto elayout = wb::engines::EngineLayout(*config, eo);
  REQUIRE(elayout.ok());
  EngineRank rank = Allocate(*elayout);
  auto session =
      LocalSession::Connect(cluster.socket("inference-node"), Identity{v1::ROLE_INFERENCE, 0, 0});
  REQUIRE(session.ok());
  REQUIRE(RegisterEngineParams(*session, rank.params, *config, eo).ok());
  ControllerClient ctl = wb::testing::ConnectController(cluster);
  wb::testing::PlanWorld(&ctl, wb::testing::World(2, 1, 1));
  auto step = ctl.Step(1);
  INFO((step.ok() ? "" : std::string(step.status().message())));
  REQUIRE(step.ok());
  for (int layer : {0, 2}) {
    const std::string pre = "model.layers." + std::to_string(layer) + ".";
    INFO(pre);
    CHECK((Param(rank, pre + "self_attn.qkv_proj.weight").v == [&] {
      std::vector<uint16_t> v;
      for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
        const std::string n = pre + "self_attn." + proj + ".weight";
        const int64_t rows = std::string(proj) == "q_proj" ? Q : NG * D;
        for (int64_t i = 0; i < rows * H; ++i) v.push_back(Pattern(n, i));
      }
      return v;
    }()));
    const Matrix o = Hf(pre + "self_attn.o_proj.weight", H, Q);
    CHECK((Param(rank, pre + "self_attn.o_proj.weight").v == o.v));
    const Matrix g = Hf(pre + "mlp.gate_proj.weight", I, H);
    const Matrix u = Hf(pre + "mlp.up_proj.weight", I, H);
    std::vector<uint16_t> gu = g.v;
    gu.insert(gu.end(), u.v.begin(), u.v.end());
    CHECK((Param(rank, pre + "mlp.gate_up_proj.weight").v == gu));
  }
}
