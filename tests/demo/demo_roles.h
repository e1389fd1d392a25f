// The demo's synthetic processes. A trainer rank registers its FSDP shards (BF16, shared
// memory, or device memory with --gpu) and applies each version's changes on command; an
// inference worker registers its destination tensors, and after every commit recomputes the
// expected bytes on its own (same synthetic weights, fused layout, FP8 block quantization) and
// compares bit for bit (with --gpu, its device buffers copied back to the host).
// Both talk to the demo driver with lines on stdin/stdout.
#pragma once

#include <string>

#include "tests/demo/demo_model.h"

namespace wb::demo {

// `gpu`: the tensors live in device memory, registered through CUDA IPC (wb-demo --gpu).
int RunTrainer(const DemoShape& shape, int rank, const std::string& socket, bool gpu = false);
int RunInference(const DemoShape& shape, int rank, const std::string& socket, bool gpu = false);

}  // namespace wb::demo
