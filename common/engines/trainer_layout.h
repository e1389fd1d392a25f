// What a trainer rank holds, under the trainer's own names: every tensor with the boxes of
// Hugging Face tensors it contains ("parts", the ParamPart of engine_layout.h), for the
// Megatron-core (TransformerEngine layer spec) and DTensor (FSDP2 / HSDP / FSDP + TP / EP)
// dialects. The one home of the trainers' layout rules (docs/trainers.md has the table); the
// agent serves them (Local TrainerLayout RPC) and the clients register each part as a view.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/engines/engine_layout.h"
#include "common/engines/model_config.h"

namespace wb::engines {

// One tensor of a trainer rank: its name in the trainer, dtype, local shape and the HF boxes
// filling it. Elements no part covers are padding (Megatron's padded vocab rows).
struct TrainerTensor {
  std::string name;
  DType dtype = weightbeam::v1::DTYPE_BF16;
  std::vector<int64_t> shape;
  std::vector<ParamPart> parts;
};

// True when `t` is one part that fills it (offset 0, the whole shape): it registers as a plain
// shard of its HF tensor; any other tensor registers its parts as views of its buffer.
bool FillsTensor(const TrainerTensor& t);

// A Megatron-core rank: tensor (tp), pipeline (pp), expert (ep) and expert-tensor (etp)
// parallel ranks, and its data-parallel rank (dp copies hold the same tensors: every one is an
// alternative source).
struct MegatronOptions {
  int tp = 1, tp_rank = 0;
  int pp = 1, pp_rank = 0;
  int ep = 1, ep_rank = 0;
  int etp = 1, etp_rank = 0;
  int dp = 1, dp_rank = 0;
  // The global layers of this stage (or virtual pipeline chunk), numbered locally from 0 in
  // this order; with `stage_layers_given` false, the uniform split layers / pp. The embedding
  // lives on pp rank 0 (in the chunk holding layer 0, when given), the final norm and output
  // layer on the last pp rank (in the chunk holding the last layer).
  bool stage_layers_given = false;
  std::vector<int64_t> stage_layers;
  int64_t vocab_divisible_by = 128;  // make_vocab_size_divisible_by (padded to a multiple x tp)
  // SequentialMLP names (mlp.experts.local_experts.{j}.linear_fc1.weight) instead of
  // TEGroupedMLP's (mlp.experts.linear_fc1.weight{j}).
  bool sequential_experts = false;
};

// Every tensor of the Megatron rank, in named_parameters() order (the router's expert_bias
// buffer, f32, after the router weight). InvalidArgument (one line naming the tensor) when the
// parallel settings do not fit the model (num_query_groups % tp != 0, ...).
absl::StatusOr<std::vector<TrainerTensor>> MegatronLayout(const ModelConfig& config,
                                                          const MegatronOptions& options);

// One DTensor placement on one mesh dimension.
struct Placement {
  enum class Kind { kReplicate, kShard, kStridedShard };
  Kind kind = Kind::kReplicate;
  int dim = 0;
};

// Placements for the tensors whose name matches `pattern` ('*' matches any characters).
struct PlacementRule {
  std::string pattern;
  std::vector<Placement> placements;  // one per mesh dimension
};

// A DTensor rank of a device mesh. Tensors are the Hugging Face ones (with `fused_experts`, the
// Transformers-v5 stacked experts mlp.experts.gate_up_proj [E, 2I, H] = per expert [gate; up],
// and mlp.experts.down_proj [E, H, I]). Each tensor takes the placements of the first rule
// matching its name (no match: replicated). Shard(d) cuts the local tensor along d in
// torch.chunk pieces (ceil(n / k) each, trailing ranks short or empty) in mesh-dimension order;
// _StridedShard(d) cuts after every plain Shard of the tensor (FSDP over TP: the TP shard is
// cut first, so blocks are TP-major).
struct DTensorOptions {
  std::vector<int> mesh;    // mesh shape
  std::vector<int> coords;  // this rank's coordinates
  std::vector<PlacementRule> rules;
  bool fused_experts = false;
};

absl::StatusOr<std::vector<TrainerTensor>> DTensorLayout(const ModelConfig& config,
                                                         const DTensorOptions& options);

// "R" / "Replicate()", "S(d)" / "Shard(d)", "SS(d)" / "_StridedShard(d)", comma-separated:
// one placement per mesh dimension.
absl::StatusOr<std::vector<Placement>> ParsePlacements(absl::string_view text);
std::string FormatPlacements(const std::vector<Placement>& placements);

// Whether `name` matches `pattern` ('*' matches any run of characters).
bool GlobMatch(absl::string_view pattern, absl::string_view name);

// The rows [start, start + size) torch.chunk gives piece `index` of `pieces` of n rows.
DimSlice ChunkRows(int64_t n, int pieces, int index);

// Layout requests (RPC, clients) are refused beyond these sizes: a config.json is user input
// and one rank's layout must stay small next to the dry run's kMaxLayoutEntries.
inline constexpr int64_t kMaxLayoutLayers = 1 << 12;
inline constexpr int64_t kMaxLayoutExperts = 1 << 12;
inline constexpr int64_t kMaxLayoutVocab = int64_t{1} << 24;
inline constexpr int kMaxLayoutParallel = 1 << 16;
// make_vocab_size_divisible_by: at most the largest vocab, so that the padding multiple
// (x tp) and the padded vocab stay far inside int64 (2^62 x 4 once wrapped to 0: SIGFPE).
inline constexpr int64_t kMaxVocabDivisibleBy = kMaxLayoutVocab;
// DTensor placement rules per request, and the characters of one pattern: the glob match runs
// once per rule and tensor name.
inline constexpr int kMaxLayoutRules = 1 << 10;
inline constexpr size_t kMaxLayoutPattern = 1 << 10;
absl::Status CheckLayoutSizes(const ModelConfig& config);

}  // namespace wb::engines
