// Test support: a synthetic RL trainer for delta mode. FP32 master weights drawn from
// N(0, std), Adam updates with random gradients uniform in [-1, 1) (first moment with beta1
// 0.9 and bias correction; the second moment at its steady state E[g^2] = 1/3, which saves
// 4 bytes per weight), and the BF16 copy a trainer would publish (round to nearest even). At
// lr ~3e-6 most BF16 values do not move.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace wb::testing {

class SyntheticAdam {
 public:
  SyntheticAdam(uint64_t elems, float stddev, uint64_t seed);
  // One optimizer step; then writes the BF16 weights into `bf16` (elems values).
  void Step(float lr);
  void WriteBf16(uint16_t* bf16) const;
  // The same, returning how many values differ from what `bf16` held.
  uint64_t WriteBf16Counting(uint16_t* bf16) const;
  uint64_t size() const { return w_.size(); }

 private:
  std::vector<float> w_, m_;
  uint64_t rng_;
  int t_ = 0;
};

uint16_t Bf16RoundNearestEven(float f);

}  // namespace wb::testing
