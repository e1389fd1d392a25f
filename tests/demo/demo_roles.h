// The demo's synthetic processes. A trainer rank registers its FSDP dim-0 shards (torch.chunk,
// BF16, Hugging Face names) with client::RegisterHfShards and applies each version's changes on
// command; an inference worker registers vLLM's parameters of its TP rank with
// client::RegisterEngineParams, and after every commit recomputes the expected bytes on its own
// (same synthetic weights, expected_layout.h's vLLM rules, FP8 block quantization) and compares
// bit for bit. Tensors live in shared memory, or with --gpu in device memory (registered
// through CUDA IPC; inference workers check the device buffers copied back to the host).
// Both talk to the demo driver with lines on stdin/stdout.
#pragma once

#include <string>

#include "tests/demo/demo_model.h"

namespace wb::demo {

// `gpu`: the tensors live in device memory, registered through CUDA IPC (wb-demo --gpu).
int RunTrainer(const DemoShape& shape, int rank, const std::string& socket, bool gpu = false);
int RunInference(const DemoShape& shape, int rank, const std::string& socket, bool gpu = false);

}  // namespace wb::demo
