// The demo's independent reference (expected_layout.h) on cases worked out by hand from
// torch.chunk and vLLM's rules, including the branches the FP8 demo cannot reach (KV heads
// replicated at tp 16, vocab padding).
#include "tests/demo/expected_layout.h"

#include <map>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

using wb::demo::ExpectedParam;
using wb::demo::Qwen3Shape;
using wb::demo::RowCopy;
using wb::demo::Rows;

namespace {

std::map<std::string, ExpectedParam> ByName(const std::vector<ExpectedParam>& params) {
  std::map<std::string, ExpectedParam> out;
  for (const auto& p : params) out[p.name] = p;
  return out;
}

void CheckCopy(const RowCopy& c, const std::string& source, int64_t src_row, int64_t src_col,
               int64_t rows, int64_t dst_row) {
  CHECK(c.source == source);
  CHECK(c.src_row == src_row);
  CHECK(c.src_col == src_col);
  CHECK(c.rows == rows);
  CHECK(c.dst_row == dst_row);
}

}  // namespace

TEST_CASE("TorchChunk: chunks of ceil(rows / world), ranks past the last chunk hold none") {
  const std::vector<std::pair<int64_t, int64_t>> ten_by_four{{0, 3}, {3, 3}, {6, 3}, {9, 1}};
  for (int r = 0; r < 4; ++r) {
    const Rows rows = wb::demo::TorchChunk(10, 4, r);
    CHECK(rows.start == ten_by_four[r].first);
    CHECK(rows.size == ten_by_four[r].second);
  }
  CHECK(wb::demo::TorchChunk(10, 6, 4).size == 2);  // 5 chunks of 2
  CHECK(wb::demo::TorchChunk(10, 6, 5).size == 0);
  CHECK(wb::demo::TorchChunk(128, 200, 127).start == 127);
  CHECK(wb::demo::TorchChunk(128, 200, 128).size == 0);
}

TEST_CASE("Qwen3-0.6B at vLLM TP 2, FP8: rank 1") {
  const auto p = ByName(wb::demo::VllmQwen3Rank(Qwen3Shape{}, 2, 1, true));
  CHECK(p.count("lm_head.weight") == 0);  // tied
  CHECK(p.size() == 1 + 28 * 8 + 1);
  const ExpectedParam& qkv = p.at("model.layers.3.self_attn.qkv_proj.weight");
  CHECK(qkv.fp8);
  CHECK(qkv.shape == std::vector<int64_t>{2048, 1024});  // 8 q heads + 4 k + 4 v, 128 each
  REQUIRE(qkv.copies.size() == 3);
  CheckCopy(qkv.copies[0], "model.layers.3.self_attn.q_proj.weight", 1024, 0, 1024, 0);
  CheckCopy(qkv.copies[1], "model.layers.3.self_attn.k_proj.weight", 512, 0, 512, 1024);
  CheckCopy(qkv.copies[2], "model.layers.3.self_attn.v_proj.weight", 512, 0, 512, 1536);
  const ExpectedParam& gu = p.at("model.layers.3.mlp.gate_up_proj.weight");
  CHECK(gu.shape == std::vector<int64_t>{3072, 1024});
  REQUIRE(gu.copies.size() == 2);
  CheckCopy(gu.copies[0], "model.layers.3.mlp.gate_proj.weight", 1536, 0, 1536, 0);
  CheckCopy(gu.copies[1], "model.layers.3.mlp.up_proj.weight", 1536, 0, 1536, 1536);
  const ExpectedParam& o = p.at("model.layers.3.self_attn.o_proj.weight");
  CHECK(o.shape == std::vector<int64_t>{1024, 1024});
  CheckCopy(o.copies.at(0), "model.layers.3.self_attn.o_proj.weight", 0, 1024, 1024, 0);
  const ExpectedParam& down = p.at("model.layers.3.mlp.down_proj.weight");
  CHECK(down.shape == std::vector<int64_t>{1024, 1536});
  CheckCopy(down.copies.at(0), "model.layers.3.mlp.down_proj.weight", 0, 1536, 1024, 0);
  const ExpectedParam& embed = p.at("model.embed_tokens.weight");
  CHECK_FALSE(embed.fp8);
  CHECK(embed.shape == std::vector<int64_t>{75968, 1024});  // 151936 is a multiple of 64
  CheckCopy(embed.copies.at(0), "model.embed_tokens.weight", 75968, 0, 75968, 0);
  const ExpectedParam& qn = p.at("model.layers.3.self_attn.q_norm.weight");
  CHECK(qn.shape == std::vector<int64_t>{128});
  CheckCopy(qn.copies.at(0), "model.layers.3.self_attn.q_norm.weight", 0, 0, 1, 0);
}

TEST_CASE("KV heads replicated when tp > kv heads; vocab padded to 64 and split") {
  Qwen3Shape s;
  s.vocab = 1000;  // padded 1024: 64 rows per rank at tp 16
  s.tie_embeddings = false;
  const auto p = ByName(wb::demo::VllmQwen3Rank(s, 16, 5, false));
  const ExpectedParam& qkv = p.at("model.layers.0.self_attn.qkv_proj.weight");
  CHECK(qkv.shape == std::vector<int64_t>{3 * 128, 1024});
  REQUIRE(qkv.copies.size() == 3);
  CheckCopy(qkv.copies[0], "model.layers.0.self_attn.q_proj.weight", 5 * 128, 0, 128, 0);
  CheckCopy(qkv.copies[1], "model.layers.0.self_attn.k_proj.weight", 2 * 128, 0, 128, 128);
  CheckCopy(qkv.copies[2], "model.layers.0.self_attn.v_proj.weight", 2 * 128, 0, 128, 256);
  const auto last = ByName(wb::demo::VllmQwen3Rank(s, 16, 15, false));
  const ExpectedParam& head = last.at("lm_head.weight");
  CHECK(head.shape == std::vector<int64_t>{64, 1024});
  CheckCopy(head.copies.at(0), "lm_head.weight", 960, 0, 40, 0);  // 24 rows of padding
  CHECK(wb::demo::VllmQwen3Rank(s, 3, 0, false).empty());         // 3 does not divide 16 heads
}

TEST_CASE("Assemble gathers rows and leaves padding zero; Fp8BlockCut names the first cut") {
  ExpectedParam p{"w", {3, 2}, false, {{"a", 1, 1, 2, 0}}};
  const std::vector<uint16_t> a{1, 2, 3, 4, 5, 6, 7, 8, 9};  // [3, 3]
  const auto got = wb::demo::Assemble(
      p, [&](const std::string&) -> const std::vector<uint16_t>& { return a; },
      [](const std::string&) {
        return wb::demo::Matrix2d{3, 3};
      });
  CHECK(got == std::vector<uint16_t>{5, 6, 8, 9, 0, 0});
  CHECK(wb::demo::Fp8BlockCut(Qwen3Shape{}, 3) ==
        "model.layers.0.self_attn.q_proj.weight at row 683");
  for (int t : {1, 2, 4, 8}) CHECK(wb::demo::Fp8BlockCut(Qwen3Shape{}, t).empty());
  CHECK_FALSE(wb::demo::Fp8BlockCut(Qwen3Shape{}, 16).empty());
}
