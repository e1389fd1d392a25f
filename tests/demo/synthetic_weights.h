// Deterministic synthetic BF16 weights for the demo: every process computes the same values
// for (tensor, element, version) on its own, so trainers can hold them and inference workers
// can recompute the expected bytes independently. Each version changes ~1% of elements (as an
// RL optimizer step does to BF16 weights).
#pragma once

#include <cstdint>
#include <string>

namespace wb::demo {

uint64_t NameHash(const std::string& name);
// Base value of element `index` (row-major, global) of a tensor: roughly N(0, 0.02) in BF16.
uint16_t BaseValue(uint64_t name_hash, uint64_t index);
// Applies version `version`'s changes to the elements [begin, end) of a tensor of `total`
// elements whose values for [begin, end) are in `values` (values[0] is element `begin`).
void ApplyVersion(uint64_t name_hash, uint64_t total, uint32_t version, uint64_t begin,
                  uint64_t end, uint16_t* values);
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float f);

}  // namespace wb::demo
