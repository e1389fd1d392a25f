#include "tests/demo/synthetic_weights.h"

#include <cstring>

namespace wb::demo {

namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t NameHash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

float Bf16ToFloat(uint16_t bits) {
  uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (inputs here are finite)
  return static_cast<uint16_t>(u >> 16);
}

uint16_t BaseValue(uint64_t name_hash, uint64_t index) {
  uint64_t r = SplitMix(name_hash ^ (index * 0xd1b54a32d192ed03ull));
  // Sum of four uniforms: close enough to a normal for weights.
  float s = 0;
  for (int i = 0; i < 4; ++i) s += static_cast<float>((r >> (16 * i)) & 0xffff) / 65535.0f;
  return FloatToBf16((s - 2.0f) * 0.02f * 1.7320508f);
}

void ApplyVersion(uint64_t name_hash, uint64_t total, uint32_t version, uint64_t begin,
                  uint64_t end, uint16_t* values) {
  // The changed elements of this version: gaps of 1..199 (mean 100) from a seeded stream.
  uint64_t state = SplitMix(name_hash ^ (uint64_t{version} * 0x9e3779b97f4a7c15ull));
  uint64_t index = 0;
  while (true) {
    state = SplitMix(state);
    index += 1 + state % 199;
    if (index >= total || index >= end) break;
    if (index < begin) continue;
    uint16_t& v = values[index - begin];
    // A small multiplicative step, at least one BF16 ulp.
    uint16_t next = FloatToBf16(Bf16ToFloat(v) * (1.0f + ((state >> 40) & 1 ? 1 : -1) / 64.0f));
    v = next != v ? next : static_cast<uint16_t>(v + 1);
  }
}

}  // namespace wb::demo
