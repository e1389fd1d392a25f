// The demo's synthetic processes. A trainer rank registers its FSDP shards (BF16, shared
// memory) and applies each version's changes on command; an inference worker registers its
// destination tensors, and after every commit recomputes the expected bytes on its own
// (same synthetic weights, fused layout, FP8 block quantization) and compares bit for bit.
// Both talk to the demo driver with lines on stdin/stdout.
#pragma once

#include <string>

#include "tests/demo/demo_model.h"

namespace wb::demo {

int RunTrainer(const DemoShape& shape, int rank, const std::string& socket);
int RunInference(const DemoShape& shape, int rank, const std::string& socket);

}  // namespace wb::demo
