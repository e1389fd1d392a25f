#include "daemon/checks/finite_check.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/checks/tensor_pieces.h"

namespace wb::checks {

namespace v1 = weightbeam::v1;

namespace {

// A value is not finite when all its exponent bits are set (IEEE formats), or for e4m3fn when
// its low seven bits are (the only NaN codes: that format has no Inf).
template <typename Bits>
bool NonFinite(Bits x, Bits mask) {
  return (x & mask) == mask;
}

// `mask` repeated over the lanes of a 64-bit word.
template <typename Bits>
uint64_t Lanes(Bits mask) {
  uint64_t w = 0;
  for (size_t i = 0; i < sizeof(uint64_t) / sizeof(Bits); ++i) {
    w |= uint64_t{mask} << (8 * sizeof(Bits) * i);
  }
  return w;
}

// Eight bytes at a time: in each lane, (x & mask) + (mask's lowest bit) reaches the lane's top
// bit only when every mask bit is set (the mask's top is the lane's bit below the sign, so no
// carry crosses lanes). Exact position on a hit.
template <typename Bits>
std::optional<uint64_t> Scan(const void* data, uint64_t elems, Bits mask) {
  constexpr uint64_t kPerWord = sizeof(uint64_t) / sizeof(Bits);
  constexpr uint64_t kBlockWords = 512;
  const uint64_t m = Lanes<Bits>(mask);
  const uint64_t add = Lanes<Bits>(static_cast<Bits>(mask & (~mask + 1)));
  const uint64_t top = Lanes<Bits>(static_cast<Bits>(Bits{1} << (8 * sizeof(Bits) - 1)));
  const auto* bytes = static_cast<const uint8_t*>(data);
  const auto* p = static_cast<const Bits*>(data);
  const uint64_t words = elems / kPerWord;
  for (uint64_t first = 0; first < words; first += kBlockWords) {
    const uint64_t n = std::min(kBlockWords, words - first);
    uint64_t any = 0;
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t w;
      std::memcpy(&w, bytes + (first + i) * 8, 8);
      any |= ((w & m) + add) & top;
    }
    if (any == 0) continue;
    for (uint64_t e = first * kPerWord; e < (first + n) * kPerWord; ++e) {
      if (NonFinite<Bits>(p[e], mask)) return e;
    }
  }
  for (uint64_t e = words * kPerWord; e < elems; ++e) {
    if (NonFinite<Bits>(p[e], mask)) return e;
  }
  return std::nullopt;
}

uint32_t ElementBytes(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F32:
      return 4;
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_F8_E4M3:
      return 1;
    default:
      return 0;  // not checked
  }
}

uint64_t BitsAt(const void* data, uint64_t index, uint32_t bytes) {
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const uint8_t*>(data) + index * bytes, bytes);
  return bits;
}

}  // namespace

std::optional<uint64_t> FirstNonFinite(const void* data, uint64_t elems, v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return Scan<uint32_t>(data, elems, 0x7f800000u);
    case v1::DTYPE_F16:
      return Scan<uint16_t>(data, elems, 0x7c00);
    case v1::DTYPE_BF16:
      return Scan<uint16_t>(data, elems, 0x7f80);
    case v1::DTYPE_F8_E4M3:
      return Scan<uint8_t>(data, elems, 0x7f);
    default:
      return std::nullopt;
  }
}

absl::Status CheckFinite(
    const std::vector<std::shared_ptr<const registry::RegisteredTensor>>& tensors,
    FiniteStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status result = absl::OkStatus();
  for (const auto& t : tensors) {
    const v1::DType dtype = t->spec.dtype();
    const uint32_t bytes = ElementBytes(dtype);
    if (bytes == 0) continue;
    // The first hit, as (element, bits); set inside the bus guard, so no allocation there.
    bool found = false;
    uint64_t element = 0, bits = 0;
    result = ReadPieces(*t, [&](const uint8_t* data, uint64_t n, uint64_t offset) {
      if (found) return;
      if (auto hit = FirstNonFinite(data, n / bytes, dtype)) {
        found = true;
        element = offset / bytes + *hit;
        bits = BitsAt(data, *hit, bytes);
      }
    });
    if (result.ok() && found) {
      result = absl::FailedPreconditionError(absl::StrFormat(
          "tensor '%s' (%s) holds a non-finite value at element %d (bits 0x%0*x): not committed",
          t->spec.name(), v1::DType_Name(dtype), element, 2 * bytes, bits));
    }
    if (!result.ok()) break;
    ++stats->tensors;
    stats->bytes += t->memory.length;
  }
  stats->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace wb::checks
