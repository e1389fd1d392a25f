// The cluster harness's synthetic processes, one per GPU rank, speaking lines on stdin/stdout
// with the driver (the same protocol as wb-demo's roles):
//  - a trainer rank registers its shards (BF16; float32 for the router bias) in shared memory,
//    fills them with the demo's deterministic synthetic weights, and on "perturb V" applies
//    version V's changes (~1% of elements), answering "ok V";
//  - an inference worker registers its destinations (fused, FP8 block-scaled + scales, BF16,
//    float32), watches its agent, and after every commit recomputes the expected bytes on its
//    own (synthetic weights -> fusion -> FP8 quantization of its slice) and compares every
//    byte: "verified V PASS <bytes>" or "verified V FAIL <first mismatch>".
#pragma once

#include <string>

#include "tests/cluster/cluster_model.h"

namespace wb::cluster {

int RunTrainer(const ClusterShape& shape, int rank, const std::string& socket);
int RunInference(const ClusterShape& shape, int replica, int rank, const std::string& socket);

}  // namespace wb::cluster
