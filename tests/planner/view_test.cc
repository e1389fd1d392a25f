// Destinations that are parts of engine buffers (BufferView): vLLM/SGLang per-rank fused
// [q_r; k_r; v_r] with KV-head replication, stacked experts, row-parallel column slices, vocab
// padding and FP8 buffers with their block scales. A tiny executor in this file applies the
// plan's ops to byte buffers; every byte is compared with a reference built by loops from the
// engines' loader rules (narrow by rank, concatenate in order), not from the views.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/planner/plan.h"
#include "tests/planner/layout_builder.h"

namespace wb::planner {
namespace {

using testing::DTYPE_BF16;
using testing::DTYPE_F32;
using testing::DTYPE_F8_E4M3;
using testing::LayoutBuilder;

constexpr uint8_t kUntouched = 0xEE;

// Element i (row-major) of the source tensor `name`: bf16 bits from a hash, so that every
// element differs and a misplaced one shows.
uint16_t Value(const std::string& name, int64_t i) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  h ^= static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 32;
  return static_cast<uint16_t>(h);
}

// Byte memory of every region: parts of one buffer (same agent, owner and buffer name) share
// one array, as they share one memory range on a real agent.
class Memory {
 public:
  explicit Memory(const std::vector<AgentLayout>& agents) : agents_(agents) {
    for (size_t a = 0; a < agents.size(); ++a) {
      for (size_t t = 0; t < agents[a].tensors.size(); ++t) {
        const TensorEntry& e = agents[a].tensors[t];
        std::vector<uint8_t>& bytes = Of(a, t);
        if (bytes.empty()) bytes.assign(e.region_bytes, kUntouched);  // parts share a buffer
        if (e.owner.role == Role::kTrainer) FillSource(e, &bytes);
      }
    }
  }

  std::vector<uint8_t>& Of(size_t a, size_t t) { return bufs_[Key(agents_[a], t)]; }

  // The buffer `buffer` of inference `rank` of `replica` on `agent`.
  const std::vector<uint8_t>& Buffer(const std::string& agent, int rank, const std::string& buffer,
                                     int replica = 0) {
    std::string key =
        agent + "/" + std::to_string(replica) + "/" + std::to_string(rank) + "/" + buffer;
    REQUIRE(bufs_.count(key) == 1);
    return bufs_[key];
  }

  // COPY: bytes as they are. FP8_BLOCK (a stand-in for the quantizer, whose arithmetic is
  // tested elsewhere): each element's low byte, and per 128x128 block of the op the float value
  // of the block's first source element's bits, at the op's scale position.
  void Apply(const Plan& plan) {
    for (int32_t a : plan.agent_order) {
      for (const PlannedOp& op : ExecutedOps(plan, a)) {
        const std::vector<uint8_t>& src = Of(op.src_agent, op.src_tensor);
        std::vector<uint8_t>& dst = Of(op.dst_agent, op.dst_tensor);
        const uint64_t se = DTypeBytes(op.SrcDType()), de = DTypeBytes(op.DstDType());
        REQUIRE(op.rows > 0);
        REQUIRE(op.src_offset + (op.rows - 1) * op.src_stride + op.row_elems * se <= src.size());
        REQUIRE(op.dst_offset + (op.rows - 1) * op.dst_stride + op.row_elems * de <= dst.size());
        auto src_bits = [&](uint64_t i, uint64_t j) {
          uint16_t v;
          std::memcpy(&v, &src[op.src_offset + i * op.src_stride + j * 2], 2);
          return v;
        };
        if (op.GetTransform() == weightbeam::v1::TRANSFORM_COPY) {
          for (uint64_t i = 0; i < op.rows; ++i) {
            std::memcpy(&dst[op.dst_offset + i * op.dst_stride],
                        &src[op.src_offset + i * op.src_stride], op.row_elems * se);
          }
          continue;
        }
        REQUIRE(op.GetTransform() == weightbeam::v1::TRANSFORM_FP8_BLOCK);
        for (uint64_t i = 0; i < op.rows; ++i) {
          for (uint64_t j = 0; j < op.row_elems; ++j) {
            dst[op.dst_offset + i * op.dst_stride + j] = src_bits(i, j) & 0xff;
          }
        }
        std::vector<uint8_t>& scales = Of(op.dst_agent, op.scale_tensor);
        for (uint64_t bi = 0; bi * kFp8Block < op.rows; ++bi) {
          for (uint64_t bj = 0; bj * kFp8Block < op.row_elems; ++bj) {
            const uint64_t at = op.scale_offset + bi * op.scale_stride + bj * 4;
            REQUIRE(at + 4 <= scales.size());
            const float f = src_bits(bi * kFp8Block, bj * kFp8Block);
            std::memcpy(&scales[at], &f, 4);
          }
        }
      }
    }
  }

 private:
  static std::string Key(const AgentLayout& agent, size_t t) {
    const TensorEntry& e = agent.tensors[t];
    if (e.view.empty()) return agent.name + "/region" + std::to_string(e.region);
    return agent.name + "/" + std::to_string(e.owner.replica) + "/" + std::to_string(e.owner.rank) +
           "/" + e.view.buffer.str();
  }

  // A trainer's shard of its global tensor: dense, or placed by its view (a trainer tensor
  // holding boxes of several tensors). Element positions from loops over the view's offset and
  // shape, not from the planner's placement code.
  static void FillSource(const TensorEntry& e, std::vector<uint8_t>* bytes) {
    const size_t n = e.shape.size();
    std::vector<int64_t> start(n, 0), size = e.shape;
    for (size_t d = 0; d < e.shard.size(); ++d)
      start[d] = e.shard[d].start, size[d] = e.shard[d].size;
    int64_t volume = 1;
    for (int64_t d : size) volume *= d;
    std::vector<int64_t> idx(n, 0);
    for (int64_t k = 0; k < volume; ++k) {
      int64_t g = 0;
      for (size_t d = 0; d < n; ++d) g = g * e.shape[d] + start[d] + idx[d];
      const uint16_t v = Value(e.name, g);
      int64_t at = k;
      if (!e.view.empty()) {
        const size_t lead = e.view.shape.size() - n;
        at = 0;
        for (size_t d = 0; d < e.view.shape.size(); ++d) {
          at = at * e.view.shape[d] + e.view.offset[d] + (d < lead ? 0 : idx[d - lead]);
        }
      }
      std::memcpy(bytes->data() + at * 2, &v, 2);
      for (size_t d = n; d-- > 0;) {
        if (++idx[d] < size[d]) break;
        idx[d] = 0;
      }
    }
  }

  const std::vector<AgentLayout>& agents_;
  std::map<std::string, std::vector<uint8_t>> bufs_;
};

std::vector<uint16_t> Bf16s(const std::vector<uint8_t>& bytes) {
  std::vector<uint16_t> out(bytes.size() / 2);
  std::memcpy(out.data(), bytes.data(), out.size() * 2);
  return out;
}

Plan MustPlan(const std::vector<AgentLayout>& agents) {
  auto plan = BuildPlan(agents, PlanOptions{});
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  return *plan;
}

std::string Problems(const std::vector<AgentLayout>& agents) {
  auto plan = BuildPlan(agents, PlanOptions{});
  REQUIRE_FALSE(plan.ok());
  return std::string(plan.status().message());
}

// Llama-like attention at tp 4 with 2 KV heads: nh 8, D 4, H 16, so each rank holds
// [q_r (2 heads); k_s; v_s] with s = r / 2 (two ranks per KV head).
constexpr int64_t kT = 4, kNh = 8, kNkv = 2, kD = 4, kH = 16;
constexpr int64_t kNq = kNh / kT, kNk = 1;
const std::string kQ = "layers.0.self_attn.q_proj.weight", kK = "layers.0.self_attn.k_proj.weight",
                  kV = "layers.0.self_attn.v_proj.weight", kO = "layers.0.self_attn.o_proj.weight";
const std::string kQkv = "layers.0.self_attn.qkv_proj.weight";

std::string InferAgent(int r) { return "infer-" + std::to_string(r / 2); }

LayoutBuilder AttentionLayout(int64_t v_offset_rows = (kNq + kNk) * kD) {
  LayoutBuilder b;
  const int64_t rows = (kNq + 2 * kNk) * kD;
  // Trainers: q and o on rows, k and v on columns (strided reads).
  for (int t = 0; t < 2; ++t) {
    const std::string agent = "train-" + std::to_string(t);
    b.Src(agent, t, kQ, {kNh * kD, kH}, {{t * kNh * kD / 2, kNh * kD / 2}, {0, kH}});
    b.Src(agent, t, kK, {kNkv * kD, kH}, {{0, kNkv * kD}, {t * kH / 2, kH / 2}});
    b.Src(agent, t, kV, {kNkv * kD, kH}, {{0, kNkv * kD}, {t * kH / 2, kH / 2}});
    b.Src(agent, t, kO, {kH, kNh * kD}, {{t * kH / 2, kH / 2}, {0, kNh * kD}});
  }
  for (int r = 0; r < kT; ++r) {
    const int64_t s = r / (kT / kNkv);
    const std::string agent = InferAgent(r);
    b.Dst(agent, 0, r, kQ, {kNh * kD, kH}, {{r * kNq * kD, kNq * kD}, {0, kH}})
        .View(agent, {rows, kH}, {0, 0}, kQkv);
    b.Dst(agent, 0, r, kK, {kNkv * kD, kH}, {{s * kNk * kD, kNk * kD}, {0, kH}})
        .View(agent, {rows, kH}, {kNq * kD, 0}, kQkv);
    b.Dst(agent, 0, r, kV, {kNkv * kD, kH}, {{s * kNk * kD, kNk * kD}, {0, kH}})
        .View(agent, {rows, kH}, {v_offset_rows, 0}, kQkv);
    // Row-parallel: a column slice of o_proj.
    b.Dst(agent, 0, r, kO, {kH, kNh * kD}, {{0, kH}, {r * kNh * kD / kT, kNh * kD / kT}})
        .View(agent, {kH, kNh * kD / kT}, {0, 0}, "layers.0.self_attn.o_proj.weight");
  }
  return b;
}

TEST_CASE(
    "views: per-rank fused qkv with KV-head replication and row-parallel o_proj, byte for "
    "byte") {
  const std::vector<AgentLayout> agents = AttentionLayout().Build();
  const Plan plan = MustPlan(agents);
  Memory mem(agents);
  mem.Apply(plan);
  for (int r = 0; r < kT; ++r) {
    INFO("rank " << r);
    const int64_t s = r * kNkv / kT;  // engines.md: rank r gets kv head r*nkv//T
    // vLLM QKVParallelLinear: q_proj[r*nq*D : +nq*D] ++ k_proj[s*D : +D] ++ v_proj[same].
    std::vector<uint16_t> want;
    for (int64_t i = 0; i < kNq * kD; ++i)
      for (int64_t j = 0; j < kH; ++j) want.push_back(Value(kQ, (r * kNq * kD + i) * kH + j));
    for (const std::string& kv : {kK, kV})
      for (int64_t i = 0; i < kNk * kD; ++i)
        for (int64_t j = 0; j < kH; ++j) want.push_back(Value(kv, (s * kD + i) * kH + j));
    CHECK(Bf16s(mem.Buffer(InferAgent(r), r, kQkv)) == want);
    // RowParallelLinear: o_proj[:, r*K/T : +K/T].
    const int64_t k = kNh * kD, kt = k / kT;
    std::vector<uint16_t> want_o;
    for (int64_t i = 0; i < kH; ++i)
      for (int64_t j = 0; j < kt; ++j) want_o.push_back(Value(kO, i * k + r * kt + j));
    CHECK(Bf16s(mem.Buffer(InferAgent(r), r, "layers.0.self_attn.o_proj.weight")) == want_o);
  }
}

TEST_CASE("views: stacked experts w13 [E, 2*I_t, H] and w2 [E, H, I_t] from 2-D experts") {
  constexpr int64_t kE = 4, kI = 8, kHid = 16, kTp = 2, kIt = kI / kTp;
  auto name = [](int64_t e, const std::string& proj) {
    return "layers.1.mlp.experts." + std::to_string(e) + "." + proj + ".weight";
  };
  LayoutBuilder b;
  for (int64_t e = 0; e < kE; ++e) {
    b.Src("train-0", 0, name(e, "gate_proj"), {kI, kHid});
    b.Src("train-0", 0, name(e, "up_proj"), {kI, kHid});
    b.Src("train-0", 0, name(e, "down_proj"), {kHid, kI});
  }
  // No EP: every rank holds all experts, each split by TP inside (mr = r).
  for (int r = 0; r < kTp; ++r) {
    for (int64_t e = 0; e < kE; ++e) {
      b.Dst("infer-0", 0, r, name(e, "gate_proj"), {kI, kHid}, {{r * kIt, kIt}, {0, kHid}})
          .View("infer-0", {kE, 2 * kIt, kHid}, {e, 0, 0}, "layers.1.mlp.experts.w13_weight");
      b.Dst("infer-0", 0, r, name(e, "up_proj"), {kI, kHid}, {{r * kIt, kIt}, {0, kHid}})
          .View("infer-0", {kE, 2 * kIt, kHid}, {e, kIt, 0}, "layers.1.mlp.experts.w13_weight");
      b.Dst("infer-0", 0, r, name(e, "down_proj"), {kHid, kI}, {{0, kHid}, {r * kIt, kIt}})
          .View("infer-0", {kE, kHid, kIt}, {e, 0, 0}, "layers.1.mlp.experts.w2_weight");
    }
  }
  const std::vector<AgentLayout> agents = b.Build();
  const Plan plan = MustPlan(agents);
  Memory mem(agents);
  mem.Apply(plan);
  for (int r = 0; r < kTp; ++r) {
    std::vector<uint16_t> w13, w2;
    for (int64_t e = 0; e < kE; ++e) {
      // [e] = gate_e[r*I_t : +I_t] ++ up_e[r*I_t : +I_t]
      for (const char* proj : {"gate_proj", "up_proj"})
        for (int64_t i = 0; i < kIt; ++i)
          for (int64_t j = 0; j < kHid; ++j)
            w13.push_back(Value(name(e, proj), (r * kIt + i) * kHid + j));
      // [e] = down_e[:, r*I_t : +I_t]
      for (int64_t i = 0; i < kHid; ++i)
        for (int64_t j = 0; j < kIt; ++j)
          w2.push_back(Value(name(e, "down_proj"), i * kI + r * kIt + j));
    }
    CHECK(Bf16s(mem.Buffer("infer-0", r, "layers.1.mlp.experts.w13_weight")) == w13);
    CHECK(Bf16s(mem.Buffer("infer-0", r, "layers.1.mlp.experts.w2_weight")) == w2);
  }
}

TEST_CASE("views: vocab padding rows of the last rank's buffer are left untouched") {
  // V 20 padded to 64 over tp 4: 16 rows per rank; rank 1 holds HF rows 16..19 and 12 padding
  // rows; ranks 2 and 3 hold padding only (no part, nothing registered here).
  constexpr int64_t kVocab = 20, kPer = 16, kHid = 8;
  const std::string embed = "model.embed_tokens.weight";
  LayoutBuilder b;
  b.Src("train-0", 0, embed, {kVocab, kHid});
  for (int r = 0; r < 2; ++r) {
    const int64_t n = std::min(kPer, kVocab - r * kPer);
    b.Dst("infer-0", 0, r, embed, {kVocab, kHid}, {{r * kPer, n}, {0, kHid}})
        .View("infer-0", {kPer, kHid}, {0, 0}, embed);
  }
  const std::vector<AgentLayout> agents = b.Build();
  Memory mem(agents);
  mem.Apply(MustPlan(agents));
  for (int r = 0; r < 2; ++r) {
    const std::vector<uint16_t> got = Bf16s(mem.Buffer("infer-0", r, embed));
    for (int64_t i = 0; i < kPer; ++i) {
      for (int64_t j = 0; j < kHid; ++j) {
        const int64_t row = r * kPer + i;
        const uint16_t want = row < kVocab ? Value(embed, row * kHid + j) : 0xEEEE;
        CHECK(got[i * kHid + j] == want);
      }
    }
  }
}

TEST_CASE("views: FP8 per-rank fused qkv and stacked experts, scales at the buffer's blocks") {
  // D 128, nh 4, nkv 2, H 256 at tp 4: [q_r; k_s; v_s] = 384 x 256, scales 3 x 2.
  constexpr int64_t D = 128, H = 256, T = 4, NH = 4, NKV = 2;
  const std::string qkv_scale = kQkv + "_scale_inv";
  LayoutBuilder b;
  for (int t = 0; t < 2; ++t) {
    const std::string agent = "train-" + std::to_string(t);
    b.Src(agent, t, kQ, {NH * D, H}, {{t * NH * D / 2, NH * D / 2}, {0, H}});
  }
  b.Src("train-0", 0, kK, {NKV * D, H});
  b.Src("train-1", 1, kV, {NKV * D, H});
  for (int r = 0; r < T; ++r) {
    const int64_t s = r * NKV / T;
    const std::string agent = InferAgent(r);
    int64_t at = 0;
    for (const auto& [name, rows, start] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
             {kQ, NH * D, r * D}, {kK, NKV * D, s * D}, {kV, NKV * D, s * D}}) {
      b.Dst(agent, 0, r, name, {rows, H}, {{start, D}, {0, H}}, DTYPE_F8_E4M3)
          .View(agent, {3 * D, H}, {at, 0}, kQkv);
      b.Dst(agent, 0, r, name + "_scale_inv", {rows / 128, H / 128},
            {{start / 128, 1}, {0, H / 128}}, DTYPE_F32)
          .View(agent, {3, H / 128}, {at / 128, 0}, qkv_scale);
      at += D;
    }
  }
  // Experts (rank 0 only): w13 [2, 256, 256] = [gate_e; up_e], scales [2, 2, 2].
  constexpr int64_t E = 2, I = 128;
  const std::string w13 = "layers.0.mlp.experts.w13_weight", w13s = w13 + "_scale_inv";
  auto ename = [](int64_t e, const std::string& proj) {
    return "layers.0.mlp.experts." + std::to_string(e) + "." + proj + ".weight";
  };
  for (int64_t e = 0; e < E; ++e) {
    for (int p = 0; p < 2; ++p) {
      const std::string name = ename(e, p == 0 ? "gate_proj" : "up_proj");
      b.Src("train-0", 0, name, {I, H});
      b.Dst("infer-0", 0, 0, name, {I, H}, {}, DTYPE_F8_E4M3)
          .View("infer-0", {E, 2 * I, H}, {e, p * I, 0}, w13);
      b.Dst("infer-0", 0, 0, name + "_scale_inv", {1, 2}, {}, DTYPE_F32)
          .View("infer-0", {E, 2, 2}, {e, p, 0}, w13s);
    }
  }
  const std::vector<AgentLayout> agents = b.Build();
  Memory mem(agents);
  mem.Apply(MustPlan(agents));

  // Reference: each buffer element's source bits; the FP8 stand-in stores the low byte, and
  // each 128x128 block's scale is the float of its first element's bits.
  auto check = [&](const std::vector<uint8_t>& data, const std::vector<uint8_t>& scales,
                   int64_t rows, const std::function<uint16_t(int64_t, int64_t)>& bits) {
    REQUIRE(data.size() == static_cast<size_t>(rows * H));
    REQUIRE(scales.size() == static_cast<size_t>(rows / 128 * H / 128 * 4));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < H; ++j) REQUIRE(data[i * H + j] == (bits(i, j) & 0xff));
    for (int64_t bi = 0; bi < rows / 128; ++bi) {
      for (int64_t bj = 0; bj < H / 128; ++bj) {
        float f;
        std::memcpy(&f, &scales[(bi * (H / 128) + bj) * 4], 4);
        CHECK(f == static_cast<float>(bits(bi * 128, bj * 128)));
      }
    }
  };
  for (int r = 0; r < T; ++r) {
    INFO("rank " << r);
    const int64_t s = r * NKV / T;
    check(mem.Buffer(InferAgent(r), r, kQkv), mem.Buffer(InferAgent(r), r, qkv_scale), 3 * D,
          [&](int64_t i, int64_t j) {
            if (i < D) return Value(kQ, (r * D + i) * H + j);
            if (i < 2 * D) return Value(kK, (s * D + i - D) * H + j);
            return Value(kV, (s * D + i - 2 * D) * H + j);
          });
  }
  // Each expert's slice of the 3-D buffers on its own: [e] = gate_e ++ up_e.
  const std::vector<uint8_t>& wd = mem.Buffer("infer-0", 0, w13);
  const std::vector<uint8_t>& ws = mem.Buffer("infer-0", 0, w13s);
  for (int64_t e = 0; e < E; ++e) {
    INFO("expert " << e);
    const size_t dn = 2 * I * H, sn = 2 * 2 * 4;
    check(std::vector<uint8_t>(wd.begin() + e * dn, wd.begin() + (e + 1) * dn),
          std::vector<uint8_t>(ws.begin() + e * sn, ws.begin() + (e + 1) * sn), 2 * I,
          [&](int64_t i, int64_t j) {
            return i < I ? Value(ename(e, "gate_proj"), i * H + j)
                         : Value(ename(e, "up_proj"), (i - I) * H + j);
          });
  }
}

TEST_CASE("views: an FP8 part that cuts a 128x128 block of its buffer is refused, naming it") {
  // D 64, one query and one KV head pair per rank (tp 1, nh 2, nkv 1): [q; k; v] = 256 rows,
  // and v lands at buffer row 192, inside the block k starts.
  constexpr int64_t D = 64, H = 128;
  LayoutBuilder b;
  const std::string scale = kQkv + "_scale_inv";
  int64_t at = 0;
  for (const auto& [name, rows] :
       std::vector<std::pair<std::string, int64_t>>{{kQ, 2 * D}, {kK, D}, {kV, D}}) {
    b.Src("train-0", 0, name, {rows, H});
    b.Dst("infer-0", 0, 0, name, {rows, H}, {}, DTYPE_F8_E4M3)
        .View("infer-0", {4 * D, H}, {at, 0}, kQkv);
    b.Dst("infer-0", 0, 0, name + "_scale_inv", {1, 1}, {}, DTYPE_F32)
        .View("infer-0", {2, 1}, {at / 128, 0}, scale);
    at += rows;
  }
  const std::string why = Problems(b.Build());
  CHECK_THAT(why, Catch::Contains("FP8 destination buffer " + kQkv +
                                  " (inference replica 0 rank 0 on agent infer-0): part " + kV +
                                  " [0:64, 0:128] at [192, 0] lands at buffer row 192: it cuts a "
                                  "128x128 scale block of the buffer"));
}

TEST_CASE("views: overlapping parts of one buffer are refused, naming the buffer") {
  // v placed on top of k.
  const std::string why = Problems(AttentionLayout(kNq * kD).Build());
  CHECK_THAT(why, Catch::Contains("buffer " + kQkv +
                                  " (inference replica 0 rank 0 on agent "
                                  "infer-0): parts overlap: " +
                                  kK + " at [8:12, 0:16] and " + kV + " at [8:12, 0:16]"));
}

TEST_CASE("views: a part that does not fit its buffer is refused, on either side") {
  LayoutBuilder b;
  b.Src("train-0", 0, kK, {8, 16});
  b.Dst("infer-0", 0, 0, kK, {8, 16}, {{0, 4}, {0, 16}}).View("infer-0", {6, 16}, {4, 0}, kQkv);
  CHECK_THAT(Problems(b.Build()), Catch::Contains("view of buffer " + kQkv +
                                                  ": the shard spans [4, 4 + 4) of buffer "
                                                  "dimension 0 whose extent is 6"));
  LayoutBuilder c;
  c.Src("train-0", 0, kK, {8, 16}).View("train-0", {8, 8}, {0, 0}, "x");
  c.Dst("infer-0", 0, 0, kK, {8, 16});
  CHECK_THAT(Problems(c.Build()),
             Catch::Contains("view of buffer x: the shard spans [0, 0 + 16) of buffer dimension 1 "
                             "whose extent is 8"));
}

// Megatron-style sources: each trainer tensor linear_qkv holds, per query group, [q heads; k;
// v] of its TP rank (tp 2, one group each), as views; `copies` data-parallel copies of them.
// Destinations: vLLM-style fused qkv_proj [q; k; v] at tp 1 on `replicas` replicas.
constexpr int64_t kGroupRows = 16;  // 2 q heads + k + v, head dim 4
LayoutBuilder MegatronQkv(int copies, int replicas, int skip_rank = -1) {
  LayoutBuilder b;
  for (int c = 0; c < copies; ++c) {
    for (int r = 0; r < 2; ++r) {
      const int rank = c * 2 + r;
      if (rank == skip_rank) continue;
      const std::string agent = "train-" + std::to_string(c);
      b.Src(agent, rank, kQ, {16, kH}, {{r * 8, 8}, {0, kH}}, DTYPE_BF16, c, r);
      b.View(agent, {kGroupRows, kH}, {0, 0}, "linear_qkv");
      b.Src(agent, rank, kK, {8, kH}, {{r * 4, 4}, {0, kH}}, DTYPE_BF16, c, r);
      b.View(agent, {kGroupRows, kH}, {8, 0}, "linear_qkv");
      b.Src(agent, rank, kV, {8, kH}, {{r * 4, 4}, {0, kH}}, DTYPE_BF16, c, r);
      b.View(agent, {kGroupRows, kH}, {12, 0}, "linear_qkv");
    }
  }
  for (int k = 0; k < replicas; ++k) {
    const std::string agent = "infer-" + std::to_string(k);
    b.Dst(agent, k, 0, kQ, {16, kH}).View(agent, {32, kH}, {0, 0}, kQkv);
    b.Dst(agent, k, 0, kK, {8, kH}).View(agent, {32, kH}, {16, 0}, kQkv);
    b.Dst(agent, k, 0, kV, {8, kH}).View(agent, {32, kH}, {24, 0}, kQkv);
  }
  return b;
}

// The fused buffer every replica must hold: [q; k; v] rows of the global tensors.
void CheckFusedQkv(Memory& mem, int replicas) {
  for (int k = 0; k < replicas; ++k) {
    std::string key = "infer-" + std::to_string(k);
    const std::vector<uint16_t> got = Bf16s(mem.Buffer(key, 0, kQkv, k));
    REQUIRE(got.size() == static_cast<size_t>(32 * kH));
    for (int64_t row = 0; row < 32; ++row) {
      const std::string& name = row < 16 ? kQ : row < 24 ? kK : kV;
      const int64_t src_row = row < 16 ? row : row < 24 ? row - 16 : row - 24;
      for (int64_t c = 0; c < kH; ++c) {
        INFO("replica " << k << " row " << row << " column " << c);
        REQUIRE(got[static_cast<size_t>(row * kH + c)] == Value(name, src_row * kH + c));
      }
    }
  }
}

TEST_CASE("views on sources: Megatron's per-group linear_qkv lands bit for bit in [q; k; v]") {
  const std::vector<AgentLayout> agents = MegatronQkv(1, 1).Build();
  const Plan plan = MustPlan(agents);
  Memory mem(agents);
  mem.Apply(plan);
  CheckFusedQkv(mem, 1);
}

TEST_CASE("views on sources: data-parallel copies share the sending, a missing one is no gap") {
  const int replicas = 8;
  const std::vector<AgentLayout> agents = MegatronQkv(2, replicas).Build();
  const Plan plan = MustPlan(agents);
  Memory mem(agents);
  mem.Apply(plan);
  CheckFusedQkv(mem, replicas);
  std::map<std::string, uint64_t> sent;
  for (const auto& [agent, op] : testing::AllOps(agents, plan)) sent[agent] += op.DstBytes();
  REQUIRE(sent.size() == 2);
  const double hi = std::max(sent["train-0"], sent["train-1"]);
  const double lo = std::min(sent["train-0"], sent["train-1"]);
  INFO("train-0 " << sent["train-0"] << " B, train-1 " << sent["train-1"] << " B");
  CHECK(hi / lo <= 1.05);
  // Copy 1's tp rank 1 never registers: copy 0 supplies its part, nothing is missing.
  const std::vector<AgentLayout> partial = MegatronQkv(2, replicas, /*skip_rank=*/3).Build();
  const Plan fallback = MustPlan(partial);
  Memory mem2(partial);
  mem2.Apply(fallback);
  CheckFusedQkv(mem2, replicas);
}

}  // namespace
}  // namespace wb::planner
