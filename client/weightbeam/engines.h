// One call per worker to register an inference engine's parameters (vLLM, SGLang names) or a
// trainer's tensors (Hugging Face FSDP shards, Megatron-core parameters, DTensor local shards),
// with the layouts of common/engines: each engine
// parameter becomes one view per HF part, FP8 scales included. Every given memory is checked
// against the config before anything is registered.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "common/engines/engine_layout.h"
#include "common/engines/trainer_layout.h"

namespace wb::client {

// Where one tensor lives: `length` bytes at `offset` of a SharedBuffer, or on a GPU.
struct TensorMemory {
  const SharedBuffer* buffer = nullptr;  // host memory
  uint64_t offset = 0;
  void* device_ptr = nullptr;  // GPU memory (CUDA IPC), when buffer is null
  int device = 0;
  uint64_t length = 0;
};

// Registers every parameter of the engine rank `options` describes. `params` maps engine
// parameter names (named_parameters(); FP8 scales as "<w>_scale_inv") to their memory; names
// the layout does not use are ignored. A missing parameter or a length that disagrees with the
// config is one InvalidArgument naming the parameter, and nothing is registered; if the agent
// refuses a part, the parts registered before it are withdrawn.
absl::Status RegisterEngineParams(LocalSession& session,
                                  const std::map<std::string, TensorMemory>& params,
                                  const engines::ModelConfig& config,
                                  const engines::EngineOptions& options);

// Registers trainer rank `rank` of `world`'s dim-0 FSDP shards (engines::FsdpRows with
// `align_rows`, `whole_small` and engines::FsdpFirstRanks), keyed by Hugging Face name. Same
// checks and all-or-nothing as above.
absl::Status RegisterHfShards(LocalSession& session,
                              const std::map<std::string, TensorMemory>& shards,
                              const engines::ModelConfig& config, int rank, int world,
                              int64_t align_rows, bool whole_small = false);

// Registers a Megatron-core rank's parameters under Megatron names (engines::MegatronLayout):
// each HF box a tensor holds becomes a view of it. A name the layout does not list (a layer of
// another stage, an expert of another EP rank), a missing tensor or a wrong length is one
// InvalidArgument naming it, and nothing is registered.
absl::Status RegisterMegatronParams(LocalSession& session,
                                    const std::map<std::string, TensorMemory>& params,
                                    const engines::ModelConfig& config,
                                    const engines::MegatronOptions& options);

// Registers a DTensor rank's local shards (engines::DTensorLayout); tensors of which the rank
// holds nothing may be absent. Same checks and all-or-nothing as above.
absl::Status RegisterDTensorParams(LocalSession& session,
                                   const std::map<std::string, TensorMemory>& shards,
                                   const engines::ModelConfig& config,
                                   const engines::DTensorOptions& options);

}  // namespace wb::client
