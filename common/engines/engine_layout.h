// What an inference engine (vLLM, SGLang) holds on one rank, and what a trainer holds, in
// Hugging Face names: every engine parameter with the boxes of HF tensors that fill it
// ("parts", registered as views of one buffer; see /docs/engines.md), plus the FP8 block-scale
// parameters. The one home of the engines' loader semantics; the Python client asks the agent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engines/model_config.h"
#include "common/planner/layout.h"

namespace wb::engines {

using DType = weightbeam::v1::DType;
using planner::DimSlice;

enum class Engine { kVllm, kSglang };

// "vllm" / "sglang"; ParseEngine returns InvalidArgument for anything else.
const char* EngineName(Engine engine);
absl::StatusOr<Engine> ParseEngine(absl::string_view name);

struct EngineOptions {
  Engine engine = Engine::kVllm;
  int tp = 1;
  int tp_rank = 0;
  // Expert parallelism. vLLM (--enable-expert-parallel): ep = dp * tp, experts are not TP-split,
  // ep_rank = dp_rank * tp + tp_rank. SGLang (--ep-size): ep divides tp, ep_rank = tp_rank /
  // (tp / ep). ep_rank -1 derives it from tp_rank (vLLM: dp_rank 0).
  int ep = 1;
  int ep_rank = -1;
  bool fp8 = false;  // FP8 e4m3 128x128-block destinations for the quantised linears
};

// A box of HF tensor `source` (shape `source_shape`) landing at `offset` (one entry per
// dimension of the parameter; the box's dims map onto the parameter's last dims).
struct ParamPart {
  std::string source;
  std::vector<int64_t> source_shape;
  std::vector<DimSlice> box;
  std::vector<int64_t> offset;
};

// One engine parameter on this rank. Elements no part covers are vocab padding: the engine's
// loader zero-fills them and weightbeam never writes them.
struct EngineParam {
  std::string name;  // the engine's named_parameters() name
  DType dtype = weightbeam::v1::DTYPE_BF16;
  std::vector<int64_t> shape;
  std::vector<ParamPart> parts;
  std::string scale_of;  // for "<w>_scale_inv": the FP8 weight it scales; empty otherwise
};

// Every parameter of rank (tp_rank, ep_rank), in the engine's order; FP8 scale parameters
// follow their weight. InvalidArgument (one line) when the parallel settings do not fit the
// model (tp not dividing the heads, ...) or, with fp8, when a part cuts a 128x128 block (the
// error names the engine parameter).
absl::StatusOr<std::vector<EngineParam>> EngineLayout(const ModelConfig& config,
                                                      const EngineOptions& options);

// A Hugging Face tensor of the checkpoint / trainer.
struct SourceTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = weightbeam::v1::DTYPE_BF16;
};

// Every HF tensor of the model (the trainer side), in checkpoint order.
std::vector<SourceTensor> SourceTensors(const ModelConfig& config);

// Rows [start, start + size) of a `rows`-row tensor that FSDP rank `rank` of `world` holds:
// dim-0 chunks of ceil(rows / world) rows rounded up to a multiple of `align` (1: torch.chunk),
// chunk c on rank (first_rank + c) % world; the ranks past the last chunk hold nothing (size 0).
// `whole_small` (align > 1): a tensor of fewer `align`-row blocks than ranks is one chunk, held
// whole by rank first_rank (FP8 destinations: a row-parallel shard of it is then one op of many
// 128x128 tiles instead of one op per tile).
DimSlice FsdpRows(int64_t rows, int world, int rank, int64_t align, int first_rank = 0,
                  bool whole_small = false);

// The rank each tensor's first chunk lives on (FsdpRows' `first_rank`), in `tensors` order.
// With `align` <= 1 every tensor starts on rank 0: torch.chunk, what FSDP2 holds. A larger
// align leaves small tensors fewer chunks than ranks (DeepSeek-V3's [2048, 7168] experts: 16
// chunks of 128 rows over 256 trainers), and starting them all on rank 0 would pile most bytes
// onto the first ranks; so each tensor starts on the rank after the previous tensor's last
// chunk, wrapping, and the chunks spread evenly over all ranks.
// With `whole_small` (FsdpRows), such a tensor takes one rank and the next tensor starts on the
// rank after it.
std::vector<int> FsdpFirstRanks(const std::vector<SourceTensor>& tensors, int world, int64_t align,
                                bool whole_small = false);

}  // namespace wb::engines
