// Delta encoding round trips (receiver copy + delta == new version, shadow updated) at the
// edges, and ApplyDelta's refusal of damaged input without touching the destination.
#include "daemon/delta/delta_codec.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "daemon/transform/transform.h"
#include "tests/transform/golden_vectors.h"

namespace wb::delta {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Encodes old -> next, checks the shadow, applies to a copy of old, checks it equals next.
DeltaEncoding RoundTrip(const std::vector<uint8_t>& old, const std::vector<uint8_t>& next,
                        int elem_size) {
  std::vector<uint8_t> shadow = old;
  absl::StatusOr<DeltaEncoding> enc = EncodeDelta(absl::MakeSpan(shadow), next, elem_size);
  REQUIRE(enc.ok());
  CHECK(shadow == next);
  if (enc->kind == DeltaEncoding::Kind::kPacked) {
    CHECK(enc->packed.size() < next.size());
    std::vector<uint8_t> receiver = old;
    absl::Status s = ApplyDelta(enc->packed, absl::MakeSpan(receiver));
    REQUIRE(s.ok());
    CHECK(receiver == next);
  }
  return *std::move(enc);
}

TEST_CASE("no change encodes to a bare header", "[delta]") {
  const std::vector<uint8_t> v = RandomBytes(1000, 1);
  const DeltaEncoding enc = RoundTrip(v, v, 2);
  CHECK(enc.kind == DeltaEncoding::Kind::kPacked);
  CHECK(enc.packed.size() == kDeltaHeaderBytes);
  CHECK(enc.changed_elems == 0);
  absl::StatusOr<DeltaHeader> h = ParseDeltaHeader(enc.packed);
  REQUIRE(h.ok());
  CHECK(h->total_elems == 500);
  CHECK(h->count == 0);
}

TEST_CASE("everything changed: dense is smaller, shadow still updated", "[delta]") {
  for (int e : {1, 2, 4}) {
    const std::vector<uint8_t> old(4096, 0), next(4096, 1);
    const DeltaEncoding enc = RoundTrip(old, next, e);
    CHECK(enc.kind == DeltaEncoding::Kind::kDense);
    CHECK(enc.packed.empty());
  }
}

TEST_CASE("the scan stops once dense is certain, and the shadow is still complete", "[delta]") {
  std::vector<uint8_t> old(200000, 0), next = old;
  for (size_t i = 0; i < next.size(); i += 2) next[i] = (i / 2) % 4 != 0;  // 3 of 4 bf16
  const DeltaEncoding enc = RoundTrip(old, next, 2);
  CHECK(enc.kind == DeltaEncoding::Kind::kDense);
  // 75000 of 100000 elements changed, 3 bytes per record (1-byte gaps): past 66659 records
  // the 200000-byte dense form is certainly smaller and the scan stops.
  CHECK(enc.changed_elems < 75000);
}

TEST_CASE("threads do not change the encoding", "[delta]") {
  const size_t bytes = (40 << 20) + 6;  // several 8 MiB ranges and a ragged tail
  const std::vector<uint8_t> old = RandomBytes(bytes, 9);
  std::vector<uint8_t> sparse = old, busy = old;
  std::mt19937 rng(10);
  for (int i = 0; i < 20000; ++i) sparse[rng() % bytes] ^= 0x40;
  sparse[bytes - 1] ^= 1;
  for (size_t i = 0; i < bytes; i += 3) busy[i] ^= 1;  // dense: stops early in every thread
  for (const auto* next : {&sparse, &busy}) {
    std::vector<uint8_t> one = old, many = old;
    absl::StatusOr<DeltaEncoding> a = EncodeDelta(absl::MakeSpan(one), *next, 2, 1);
    absl::StatusOr<DeltaEncoding> b = EncodeDelta(absl::MakeSpan(many), *next, 2, 5);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->kind == b->kind);
    CHECK(a->packed == b->packed);
    CHECK(one == *next);
    CHECK(many == *next);
  }
}

TEST_CASE("changes at both ends need 4-byte gaps", "[delta]") {
  const size_t elems = 1 << 20;
  std::vector<uint8_t> old = RandomBytes(elems * 2, 2), next = old;
  next[0] ^= 1;                 // element 0
  next[elems * 2 - 1] ^= 0x80;  // last element, high byte
  const DeltaEncoding enc = RoundTrip(old, next, 2);
  REQUIRE(enc.kind == DeltaEncoding::Kind::kPacked);
  CHECK(enc.changed_elems == 2);
  absl::StatusOr<DeltaHeader> h = ParseDeltaHeader(enc.packed);
  REQUIRE(h.ok());
  CHECK(h->index_width == 4);
  CHECK(h->elem_size == 2);
  CHECK(enc.packed.size() == kDeltaHeaderBytes + 2 * (4 + 2));
}

TEST_CASE("the narrowest index width that holds every gap is chosen", "[delta]") {
  struct Case {
    size_t gap;
    int width;
  };
  for (Case c : {Case{255, 1}, Case{256, 2}, Case{65535, 2}, Case{65536, 4}}) {
    INFO("gap " << c.gap);
    std::vector<uint8_t> old(4 * 300000, 0), next = old;
    for (size_t i = 7; i < 300000; i += c.gap) next[i * 4 + 3] = 9;
    const DeltaEncoding enc = RoundTrip(old, next, 4);
    REQUIRE(enc.kind == DeltaEncoding::Kind::kPacked);
    CHECK(ParseDeltaHeader(enc.packed)->index_width == c.width);
  }
}

TEST_CASE("sparse random changes round-trip for every element size and ragged length", "[delta]") {
  std::mt19937 rng(4);
  for (int e : {1, 2, 4}) {
    for (size_t elems : {1, 3, 7, 31, 33, 1000, 4097, 100003}) {
      INFO("elem size " << e << ", " << elems << " elements");
      std::vector<uint8_t> old = RandomBytes(elems * e, static_cast<uint32_t>(elems + e));
      std::vector<uint8_t> next = old;
      for (size_t i = 0; i < elems; ++i) {
        if (rng() % 100 == 0) next[i * e + rng() % e] ^= static_cast<uint8_t>(1 + rng() % 255);
      }
      next[(elems - 1) * e] ^= 0x10;  // the ragged tail element always changes
      const DeltaEncoding enc = RoundTrip(old, next, e);
      if (elems >= 1000) CHECK(enc.kind == DeltaEncoding::Kind::kPacked);
    }
  }
}

// The packed form by its definition, one element at a time (empty: dense is not larger).
std::vector<uint8_t> ReferenceEncode(const std::vector<uint8_t>& old,
                                     const std::vector<uint8_t>& next, int e, uint64_t* count) {
  std::vector<uint64_t> changed;
  for (size_t off = 0; off < next.size(); off += e) {
    if (std::memcmp(old.data() + off, next.data() + off, e) != 0) changed.push_back(off / e);
  }
  *count = changed.size();
  uint64_t max_gap = 0, prev = 0;
  for (uint64_t idx : changed) {
    max_gap = std::max(max_gap, idx - prev);
    prev = idx;
  }
  const int width = max_gap <= 0xff ? 1 : max_gap <= 0xffff ? 2 : 4;
  const size_t size = kDeltaHeaderBytes + changed.size() * (width + e);
  if (size >= next.size()) return {};
  std::vector<uint8_t> out;
  auto put = [&out](uint64_t v, int bytes) {
    for (int b = 0; b < bytes; ++b) out.push_back(static_cast<uint8_t>(v >> (8 * b)));
  };
  put(kDeltaMagic, 4);
  put(kDeltaVersion, 1);
  put(e, 1);
  put(width, 1);
  put(0, 1);
  put(next.size() / e, 8);
  put(changed.size(), 8);
  prev = 0;
  for (uint64_t idx : changed) {
    put(idx - prev, width);
    prev = idx;
  }
  for (uint64_t idx : changed) {
    for (int b = 0; b < e; ++b) out.push_back(next[idx * e + b]);
  }
  return out;
}

// Changes about `fraction` of the elements of `v`: one random byte of each, at random positions
// or in runs of 16 elements.
std::vector<uint8_t> Changed(const std::vector<uint8_t>& v, int e, double fraction, bool runs,
                             uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> next = v;
  const size_t elems = v.size() / e;
  const size_t changes = static_cast<size_t>(elems * fraction);
  const size_t run = runs ? 16 : 1;
  for (size_t done = 0; done < changes; done += run) {
    const size_t start = rng() % elems;
    for (size_t k = start; k < std::min(elems, start + run); ++k) {
      next[k * e + rng() % e] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
  }
  return next;
}

void CheckAgainstReference(const std::vector<uint8_t>& old, const std::vector<uint8_t>& next, int e,
                           int threads) {
  uint64_t count = 0;
  const std::vector<uint8_t> want = ReferenceEncode(old, next, e, &count);
  std::vector<uint8_t> shadow = old;
  absl::StatusOr<DeltaEncoding> enc = EncodeDelta(absl::MakeSpan(shadow), next, e, threads);
  REQUIRE(enc.ok());
  const bool shadow_updated = shadow == next;  // (not printed: megabytes)
  CHECK(shadow_updated);
  if (want.empty()) {
    CHECK(enc->kind == DeltaEncoding::Kind::kDense);
    CHECK(enc->changed_elems <= count);
  } else {
    REQUIRE(enc->kind == DeltaEncoding::Kind::kPacked);
    CHECK(enc->changed_elems == count);
    const bool same_bytes = enc->packed == want;  // byte for byte (not printed: megabytes)
    CHECK(same_bytes);
  }
}

TEST_CASE("the encoding equals a reference encoder at every density and thread count", "[delta]") {
  // Lengths below one 64-byte chunk, with a ragged tail after whole chunks and 4 KiB blocks.
  for (size_t bytes : {size_t{36}, size_t{4096 * 3 + 100}, size_t{(1 << 20) + 36}}) {
    const std::vector<uint8_t> old = RandomBytes(bytes, static_cast<uint32_t>(bytes));
    for (int e : {1, 2, 4}) {
      for (double fraction : {0.0, 0.001, 0.01, 0.026, 0.05, 0.2, 0.45, 0.9}) {
        for (bool runs : {false, true}) {
          INFO("bytes " << bytes << " elem " << e << " fraction " << fraction << " runs " << runs);
          const std::vector<uint8_t> next = Changed(old, e, fraction, runs, 7);
          CheckAgainstReference(old, next, e, 1);
        }
      }
    }
  }
}

TEST_CASE("large buffers encode like the reference on any number of threads", "[delta]") {
  const size_t bytes = (33 << 20) + 36;  // four 8 MiB ranges and a ragged tail
  const std::vector<uint8_t> old = RandomBytes(bytes, 21);
  for (int e : {1, 2, 4}) {
    for (double fraction : {0.001, 0.026, 0.05}) {
      for (bool runs : {false, true}) {
        const std::vector<uint8_t> next = Changed(old, e, fraction, runs, 8);
        for (int threads : {1, 2, 4}) {
          INFO("elem " << e << " fraction " << fraction << " runs " << runs << " threads "
                       << threads);
          CheckAgainstReference(old, next, e, threads);
        }
      }
    }
  }
}

TEST_CASE("delta over fp8 block output and its scales (ragged blocks)", "[delta][fp8]") {
  using transform::DType;
  using transform::Kind;
  transform::golden::RaggedCase c = transform::golden::MakeRaggedCase();
  transform::TransformDesc d{Kind::kFp8Block, DType::kBF16, DType::kF8E4M3, 130, 260};
  std::vector<uint8_t> fp8_old(130 * 260), fp8_new(130 * 260);
  std::vector<float> scales_old(6), scales_new(6);
  REQUIRE(transform::ApplyTransformCpu(d, c.bf16.data(), fp8_old.data(), scales_old.data()).ok());
  // A training step: a few weights move, one of them the amax of the ragged corner block.
  c.bf16[5 * 260 + 9] ^= 0x0001;
  c.bf16[129 * 260 + 259] ^= 0x0040;
  c.bf16[128 * 260 + 257] = 0x4700;  // 32768: new amax of block (1, 2), its scale changes
  REQUIRE(transform::ApplyTransformCpu(d, c.bf16.data(), fp8_new.data(), scales_new.data()).ok());
  const DeltaEncoding bytes = RoundTrip(fp8_old, fp8_new, 1);
  CHECK(bytes.kind == DeltaEncoding::Kind::kPacked);
  CHECK(bytes.changed_elems >= 2);
  auto as_bytes = [](const std::vector<float>& f) {
    std::vector<uint8_t> b(f.size() * 4);
    std::memcpy(b.data(), f.data(), b.size());
    return b;
  };
  const std::vector<uint8_t> s_old = as_bytes(scales_old), s_new = as_bytes(scales_new);
  std::vector<uint8_t> shadow = s_old;
  absl::StatusOr<DeltaEncoding> scales = EncodeDelta(absl::MakeSpan(shadow), s_new, 4);
  REQUIRE(scales.ok());
  CHECK(scales->changed_elems == 1);
  CHECK(shadow == s_new);
  // 6 floats are 24 bytes: header + one record is not smaller, so dense it is.
  CHECK(scales->kind == DeltaEncoding::Kind::kDense);
}

std::vector<uint8_t> SamplePacked(std::vector<uint8_t>* old_out, std::vector<uint8_t>* next_out) {
  std::vector<uint8_t> old(2000, 0), next = old;
  next[10] = 1;
  next[1500] = 2;
  std::vector<uint8_t> shadow = old;
  absl::StatusOr<DeltaEncoding> enc = EncodeDelta(absl::MakeSpan(shadow), next, 2);
  REQUIRE(enc.ok());
  REQUIRE(enc->kind == DeltaEncoding::Kind::kPacked);
  if (old_out) *old_out = old;
  if (next_out) *next_out = next;
  return enc->packed;  // elem 2, width 2: gaps at 24, 26; values at 28, 30
}

TEST_CASE("damaged deltas are refused and the destination is untouched", "[delta]") {
  const std::vector<uint8_t> good = SamplePacked(nullptr, nullptr);
  const std::vector<uint8_t> original(2000, 0xcd);
  auto apply = [&](const std::vector<uint8_t>& packed, size_t dst_size = 2000) {
    std::vector<uint8_t> dst(original.begin(), original.begin() + dst_size);
    absl::Status s = ApplyDelta(packed, absl::MakeSpan(dst));
    CHECK(std::equal(dst.begin(), dst.end(), original.begin()));
    return std::string(s.message());
  };
  std::vector<uint8_t> p = good;
  p[0] = 'X';
  CHECK(apply(p) == "delta: bad magic (not a weightbeam delta)");
  p = good;
  p[4] = 9;
  CHECK(apply(p) == "delta: unsupported version 9");
  p = good;
  p[5] = 3;
  CHECK(apply(p) == "delta: element size 3 is not 1, 2 or 4 bytes");
  p = good;
  p[6] = 3;
  CHECK(apply(p) == "delta: index width 3 is not 1, 2, 4 or 8 bytes");
  p = good;
  p.pop_back();
  CHECK(apply(p) == "delta: header announces 2 records of 4 bytes but 7 bytes follow");
  CHECK(apply(std::vector<uint8_t>(good.begin(), good.begin() + 10)) ==
        "delta: 10 bytes is shorter than the 24-byte header");
  CHECK(apply(good, 1998) ==
        "delta: encodes 1000 elements of 2 bytes but the destination has 1998 bytes");
  p = good;
  p[26] = 0xff;  // second gap 0x..ff: index 5 + 0x02ff... out of range
  p[27] = 0xff;
  CHECK(apply(p) == "delta: record 1 index 65540 is out of range (1000 elements)");
  p = good;
  p[26] = 0;
  p[27] = 0;
  CHECK(apply(p) == "delta: record 1 repeats index 5 (gap 0)");
}

TEST_CASE("encoder arguments are checked", "[delta]") {
  std::vector<uint8_t> a(10), b(12);
  CHECK(EncodeDelta(absl::MakeSpan(a), b, 2).status().message() ==
        "delta: shadow has 10 bytes but the new version 12");
  CHECK(EncodeDelta(absl::MakeSpan(a), a, 3).status().message() ==
        "delta: element size 3 is not 1, 2 or 4 bytes");
  CHECK(EncodeDelta(absl::MakeSpan(a), a, 4).status().message() ==
        "delta: 10 bytes is not a whole number of 4-byte elements");
}

}  // namespace
}  // namespace wb::delta
