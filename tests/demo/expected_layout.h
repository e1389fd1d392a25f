// What the demo's processes hold, written down here from vLLM's loader rules for Qwen3 dense
// models (docs/engines.md; tests/python/engine_reference.py is the spec) and from torch.chunk,
// without common/engines: the demo registers through the engine layouts (the code under test)
// and checks every inference rank's bytes against this.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace wb::demo {

// The config.json fields that decide the layouts (Qwen3-0.6B's by default).
struct Qwen3Shape {
  int64_t hidden = 1024;
  int64_t intermediate = 3072;
  int64_t layers = 28;
  int64_t heads = 16;
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  int64_t vocab = 151936;
  bool tie_embeddings = true;
  bool fp8 = true;  // false: no quantization_config (every destination BF16)
};

// Qwen3-0.6B's config.json with `s`'s sizes, plus (when `s.fp8`)
// quantization_config.weight_block_size [128, 128] (FP8 block-quantised linears).
std::string Qwen3ConfigJson(const Qwen3Shape& s);

// One Hugging Face tensor of the checkpoint (BF16; 1-D norms, 2-D matrices).
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<HfTensor> Qwen3HfTensors(const Qwen3Shape& s);

// torch.chunk(t, world, dim=0)[rank] as rows [start, start + size): chunks of ceil(rows /
// world) rows; a rank past the last chunk holds none (size 0).
struct Rows {
  int64_t start = 0, size = 0;
};
Rows TorchChunk(int64_t rows, int world, int rank);

// Where torch.chunk over `trainers` ranks cuts an FP8 linear's HF rows inside a 128-row block
// ("model.layers.0.self_attn.q_proj.weight at row 683"), or "" when every cut is at a multiple
// of 128. FP8 block scaling takes each 128x128 block from one trainer.
std::string Fp8BlockCut(const Qwen3Shape& s, int trainers);

// Rows x columns of a parameter or tensor seen as a matrix (a 1-D one is one row).
struct Matrix2d {
  int64_t rows = 0, cols = 0;
};
Matrix2d As2d(const std::vector<int64_t>& shape);

// Rows [src_row, +rows) x columns [src_col, +param cols) of HF tensor `source` (seen as 2-D)
// land in rows [dst_row, +rows) of the parameter.
struct RowCopy {
  std::string source;
  int64_t src_row = 0, src_col = 0, rows = 0, dst_row = 0;
};

// One engine parameter of a rank: its named_parameters() name and shape, whether it is FP8 e4m3
// (then with an f32 `<name>_scale_inv` of [ceil(rows/128), ceil(cols/128)], one scale per
// 128x128 block), and where its rows come from. Rows no copy fills are vocabulary padding: the
// engine's loader zero-fills them.
struct ExpectedParam {
  std::string name;
  std::vector<int64_t> shape;
  bool fp8 = false;
  std::vector<RowCopy> copies;
};

// vLLM's parameters on tensor-parallel rank `rank` of `tp` (Qwen3ForCausalLM): qkv_proj =
// [q_r; k_r; v_r] (KV heads replicated when tp > kv heads), gate_up_proj = [gate_r; up_r],
// o_proj / down_proj the rank's columns, embed_tokens (and lm_head unless tied) the rank's rows
// of the vocab padded to a multiple of 64, norms and q_norm / k_norm whole. `fp8`: the four
// linears are FP8. Empty when tp does not split the model evenly.
std::vector<ExpectedParam> VllmQwen3Rank(const Qwen3Shape& s, int tp, int rank, bool fp8);

// The parameter's BF16 values (row-major), gathered from the HF tensors `source(name)` returns
// whole; padding rows are zero.
std::vector<uint16_t> Assemble(
    const ExpectedParam& p,
    const std::function<const std::vector<uint16_t>&(const std::string& name)>& source,
    const std::function<Matrix2d(const std::string& name)>& source_shape);

}  // namespace wb::demo
