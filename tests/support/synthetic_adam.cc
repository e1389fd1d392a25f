#include "tests/support/synthetic_adam.h"

#include <cmath>
#include <cstring>

namespace wb::testing {

uint16_t Bf16RoundNearestEven(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

SyntheticAdam::SyntheticAdam(uint64_t elems, float stddev, uint64_t seed)
    : w_(elems), m_(elems, 0.f), rng_(seed * 0x9e3779b97f4a7c15ull + 1) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.f, stddev);
  for (auto& x : w_) x = normal(gen);
}

void SyntheticAdam::Step(float lr) {
  ++t_;
  const float b1 = 0.9f;
  // lr * m_hat / sqrt(v_hat) with v_hat = E[g^2] = 1/3.
  const float scale = lr / (1.f - std::pow(b1, t_)) * std::sqrt(3.f);
  for (size_t i = 0; i < w_.size(); ++i) {
    // xorshift64*: a cheap gradient in [-1, 1).
    rng_ ^= rng_ >> 12;
    rng_ ^= rng_ << 25;
    rng_ ^= rng_ >> 27;
    const float g = static_cast<float>((rng_ * 0x2545f4914f6cdd1dull) >> 40) / 8388608.f - 1.f;
    m_[i] = b1 * m_[i] + (1 - b1) * g;
    w_[i] -= scale * m_[i];
  }
}

void SyntheticAdam::WriteBf16(uint16_t* bf16) const {
  for (size_t i = 0; i < w_.size(); ++i) bf16[i] = Bf16RoundNearestEven(w_[i]);
}

}  // namespace wb::testing

namespace wb::testing {

uint64_t SyntheticAdam::WriteBf16Counting(uint16_t* bf16) const {
  uint64_t changed = 0;
  for (size_t i = 0; i < w_.size(); ++i) {
    const uint16_t v = Bf16RoundNearestEven(w_[i]);
    changed += v != bf16[i];
    bf16[i] = v;
  }
  return changed;
}

}  // namespace wb::testing
