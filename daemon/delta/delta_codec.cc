// Delta encoder and applier: the scan builds one changed-element bit mask per 64 bytes (AVX2
// compares where the CPU has them), skips chunks without changes and walks the set bits of
// the others, writing u32 gaps and values per range; the packed form is assembled once the
// index width of the whole buffer is known.
#include "daemon/delta/delta_codec.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>

// WB_DELTA_NO_AVX2 builds only the portable scan, to test it on an AVX2 machine:
//   bazel test --per_file_copt=daemon/delta/delta_codec.cc@-DWB_DELTA_NO_AVX2
//       //tests/transform:delta_codec_test   (one command line)
#if defined(__x86_64__) && !defined(WB_DELTA_NO_AVX2)
#define WB_DELTA_AVX2 1
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"

namespace wb::delta {
namespace {

// Below this many bytes per thread the threads cost more than they save.
constexpr size_t kMinBytesPerThread = 8 << 20;

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

template <typename T>
void Put(std::vector<uint8_t>& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

int WidthFor(uint64_t max_gap) {
  if (max_gap <= 0xff) return 1;
  if (max_gap <= 0xffff) return 2;
  if (max_gap <= 0xffffffffull) return 4;
  return 8;
}

// Records found by one scanner, packed once the index width of the whole buffer is known.
// Gaps are kept as u32 (gaps of 2^32 - 1 elements or more are kBigGap there and their true
// value is in `big_gaps`): 4 bytes per record instead of an 8-byte absolute index.
struct Records {
  static constexpr uint32_t kBigGap = 0xffffffff;
  uint64_t begin_elem = 0;  // record 0's gap counts from here
  uint64_t count = 0;
  uint64_t last = 0;  // absolute index of the last record (begin_elem when none)
  // Largest gap, counting only gaps that can exceed 63 elements (a chunk's first record; the
  // others cannot change the width). Record 0's gap from begin_elem bounds its true gap below.
  uint64_t max_gap = 0;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<uint32_t[], Free> gaps;
  std::unique_ptr<uint8_t[], Free> values;  // count * elem_size bytes
  uint64_t capacity = 0;                    // records gaps and values have room for
  std::vector<uint64_t> big_gaps;

  uint64_t Gap(uint64_t i, size_t& big) const {
    return gaps[i] == kBigGap ? big_gaps[big++] : gaps[i];
  }
  uint64_t FirstIndex() const {
    size_t big = 0;
    return begin_elem + Gap(0, big);
  }
};

// Makes room for `need` records (rarely: capacity doubles). realloc lets large arrays grow
// without a copy (glibc remaps their pages). Out of line, so the scan loops stay small.
__attribute__((noinline)) void Grow(Records& r, uint64_t need, int elem_size) {
  const uint64_t capacity = std::max<uint64_t>({need, 2 * r.capacity, 1 << 14});
  void* gaps = std::realloc(r.gaps.get(), capacity * sizeof(uint32_t));
  if (gaps == nullptr) throw std::bad_alloc();
  r.gaps.release();
  r.gaps.reset(static_cast<uint32_t*>(gaps));
  void* values = std::realloc(r.values.get(), capacity * elem_size);
  if (values == nullptr) throw std::bad_alloc();
  r.values.release();
  r.values.reset(static_cast<uint8_t*>(values));
  r.capacity = capacity;
}

__attribute__((noinline)) void AddBigGap(Records& r, uint64_t gap) { r.big_gaps.push_back(gap); }

constexpr size_t kChunkBytes = 64;    // one changed-element mask per chunk
constexpr size_t kBlockBytes = 4096;  // budget checks and room for records once per block

// Bit k * E of the result is set when element k of the 64 bytes at a and b differs.
template <int E>
uint64_t ElementMask(uint64_t byte_mask) {
  if (E >= 2) byte_mask |= byte_mask >> 1;
  if (E >= 4) byte_mask |= byte_mask >> 2;
  if (E == 2) return byte_mask & 0x5555555555555555ull;
  if (E == 4) return byte_mask & 0x1111111111111111ull;
  return byte_mask;
}

struct PortableChunks {
  // Bit i set when byte i differs.
  static uint64_t ByteMask(uint64_t x) {
    constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full;
    const uint64_t high = (((x & kLow7) + kLow7) | x) & ~kLow7;  // top bit of nonzero bytes
    return ((high >> 7) * 0x0102040810204080ull) >> 56;
  }
  template <int E>
  static uint64_t Mask(const uint8_t* a, const uint8_t* b) {
    uint64_t x[8], any = 0;
    for (int w = 0; w < 8; ++w) {
      x[w] = Load64(a + 8 * w) ^ Load64(b + 8 * w);
      any |= x[w];
    }
    if (any == 0) return 0;
    uint64_t bytes = 0;
    for (int w = 0; w < 8; ++w) bytes |= ByteMask(x[w]) << (8 * w);
    return ElementMask<E>(bytes);
  }
};

#if defined(WB_DELTA_AVX2)
struct Avx2Chunks {
  template <int E>
  __attribute__((target("avx2"))) static uint64_t Mask(const uint8_t* a, const uint8_t* b) {
    const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
    __m256i e0, e1;
    if (E == 1) {
      e0 = _mm256_cmpeq_epi8(a0, b0);
      e1 = _mm256_cmpeq_epi8(a1, b1);
    } else if (E == 2) {
      e0 = _mm256_cmpeq_epi16(a0, b0);
      e1 = _mm256_cmpeq_epi16(a1, b1);
    } else {
      e0 = _mm256_cmpeq_epi32(a0, b0);
      e1 = _mm256_cmpeq_epi32(a1, b1);
    }
    const uint64_t equal =
        static_cast<uint32_t>(_mm256_movemask_epi8(e0)) |
        (static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_epi8(e1))) << 32);
    // Equal elements set all their E bits, so one bit per element is enough.
    if (E == 2) return ~equal & 0x5555555555555555ull;
    if (E == 4) return ~equal & 0x1111111111111111ull;
    return ~equal;
  }
};

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}
#endif

// Scans bytes [begin, end) of the buffers (begin a multiple of 64): records the changed
// elements (gap and value) and copies changed 64-byte chunks into the shadow. Several
// scanners run on consecutive ranges at once and share `found`, the number of records found
// by all of them. A scanner stops (Run returns false) once the records found make dense
// certain, which keeps memory bounded: all records at 1-byte gaps, or its own records at the
// narrowest width their gaps allow, fill `budget` bytes. The check runs once per 4 KiB block,
// so a scanner may stop a block late.
template <int E>
class ChangeScanner {
 public:
  ChangeScanner(uint8_t* shadow, const uint8_t* next, size_t begin, size_t end, uint64_t budget,
                std::atomic<uint64_t>& found, Records& records)
      : shadow_(shadow),
        next_(next),
        begin_(begin),
        end_(end),
        budget_(budget),
        found_(found),
        rec_(records) {
    rec_.begin_elem = begin / E;
    rec_.last = rec_.begin_elem;
  }

  bool Run();

  template <typename Chunks>
  bool Scan() {
    size_t off = begin_;
    const size_t chunks_end = begin_ + (end_ - begin_) / kChunkBytes * kChunkBytes;
    while (off < chunks_end) {
      const size_t block_end = std::min(chunks_end, off + kBlockBytes);
      if (rec_.count + kBlockBytes / E > rec_.capacity) Grow(rec_, rec_.count + kBlockBytes / E, E);
      uint32_t* gaps = rec_.gaps.get() + rec_.count;
      uint8_t* values = rec_.values.get() + rec_.count * E;
      uint32_t* const gaps_begin = gaps;
      uint64_t last = rec_.last, max_gap = rec_.max_gap;
      for (; off < block_end; off += kChunkBytes) {
        uint64_t m = Chunks::template Mask<E>(shadow_ + off, next_ + off);
        if (m == 0) continue;
        std::memcpy(shadow_ + off, next_ + off, kChunkBytes);
        const uint64_t base = off / E;
        // Only a chunk's first record can have a gap above 63 elements (which alone can widen
        // the index or be 2^32 - 1 or more), so only it is checked.
        uint64_t idx = base + static_cast<uint64_t>(__builtin_ctzll(m)) / E;
        const uint64_t gap = idx - last;
        max_gap = std::max(max_gap, gap);
        if (__builtin_expect(gap >= Records::kBigGap, 0)) {
          AddBigGap(rec_, gap);
          *gaps++ = Records::kBigGap;
        } else {
          *gaps++ = static_cast<uint32_t>(gap);
        }
        std::memcpy(values, next_ + idx * E, E);
        values += E;
        m &= m - 1;
        while (m != 0) {
          const uint64_t at = base + static_cast<uint64_t>(__builtin_ctzll(m)) / E;
          *gaps++ = static_cast<uint32_t>(at - idx);
          idx = at;
          std::memcpy(values, next_ + idx * E, E);
          values += E;
          m &= m - 1;
        }
        last = idx;
      }
      rec_.last = last;
      rec_.max_gap = max_gap;
      const uint64_t added = gaps - gaps_begin;
      rec_.count += added;
      if (!WithinBudget(added)) return false;
    }
    return ScanTail(off);
  }

 private:
  // The last few bytes (fewer than 64), element by element.
  bool ScanTail(size_t off) {
    if (rec_.count + kChunkBytes / E > rec_.capacity) Grow(rec_, rec_.count + kChunkBytes / E, E);
    uint64_t added = 0;
    for (; off < end_; off += E) {
      if (std::memcmp(shadow_ + off, next_ + off, E) == 0) continue;
      const uint64_t idx = off / E, gap = idx - rec_.last;
      rec_.max_gap = std::max(rec_.max_gap, gap);
      rec_.last = idx;
      if (gap >= Records::kBigGap) AddBigGap(rec_, gap);
      rec_.gaps[rec_.count] = static_cast<uint32_t>(std::min<uint64_t>(gap, Records::kBigGap));
      std::memcpy(rec_.values.get() + rec_.count * E, next_ + off, E);
      std::memcpy(shadow_ + off, next_ + off, E);
      ++rec_.count;
      ++added;
    }
    return WithinBudget(added);
  }

  bool WithinBudget(uint64_t added) {
    // Records are published to the shared count in batches, so sparse changes cost no
    // cache-line traffic between threads; the early exit may come a batch per thread late.
    unpublished_ += added;
    if (unpublished_ >= kPublishBatch) {
      found_.fetch_add(unpublished_, std::memory_order_relaxed);
      unpublished_ = 0;
    }
    const uint64_t all = found_.load(std::memory_order_relaxed) + unpublished_;
    return all * (1 + E) < budget_ && rec_.count * (WidthFor(rec_.max_gap) + E) < budget_;
  }

  static constexpr uint64_t kPublishBatch = 4096;

  uint8_t* shadow_;
  const uint8_t* next_;
  size_t begin_;
  size_t end_;
  uint64_t budget_;
  std::atomic<uint64_t>& found_;
  Records& rec_;
  uint64_t unpublished_ = 0;
};

#if defined(WB_DELTA_AVX2)
// The scan loop compiled for AVX2 (flatten inlines the loop and the mask into this body).
template <int E>
__attribute__((target("avx2"), flatten)) bool ScanAvx2(ChangeScanner<E>& scanner) {
  return scanner.template Scan<Avx2Chunks>();
}
#endif

template <int E>
bool ChangeScanner<E>::Run() {
#if defined(WB_DELTA_AVX2)
  if (HaveAvx2()) return ScanAvx2<E>(*this);
#endif
  return Scan<PortableChunks>();
}

// Scans the whole buffer on up to `threads` threads; `parts` gets each range's records, in
// buffer order. Returns false when a scanner stopped early (dense is certain).
template <int E>
bool ScanChanges(uint8_t* shadow, const uint8_t* next, size_t bytes, uint64_t budget, int threads,
                 std::vector<Records>& parts) {
  const size_t chunks = std::max<size_t>(
      1, std::min<size_t>(static_cast<size_t>(threads), bytes / kMinBytesPerThread));
  // Ranges start on 64-byte boundaries so each thread's chunks stay aligned to elements.
  const size_t chunk = (bytes / chunks + 63) / 64 * 64;
  std::atomic<uint64_t> found{0};
  parts.resize(chunks);
  if (chunks == 1) {
    return ChangeScanner<E>(shadow, next, 0, bytes, budget, found, parts[0]).Run();
  }
  std::vector<char> within(chunks, 0);
  std::vector<std::thread> pool;
  for (size_t i = 0; i < chunks; ++i) {
    const size_t begin = std::min(bytes, i * chunk);
    const size_t end = i + 1 == chunks ? bytes : std::min(bytes, (i + 1) * chunk);
    pool.emplace_back([&, i, begin, end] {
      within[i] = ChangeScanner<E>(shadow, next, begin, end, budget, found, parts[i]).Run();
    });
  }
  for (auto& t : pool) t.join();
  return std::all_of(within.begin(), within.end(), [](char w) { return w != 0; });
}

// Writes every part's gaps at width G; `first_gaps[p]` is part p's record 0 gap counted from
// the previous part's last record (the parts hold it counted from their range start).
template <typename G>
void WriteGaps(const std::vector<Records>& parts, const std::vector<uint64_t>& first_gaps,
               uint8_t* out) {
  for (size_t p = 0; p < parts.size(); ++p) {
    const Records& r = parts[p];
    if (r.count == 0) continue;
    if (sizeof(G) == 8) {
      size_t big = 0;
      for (uint64_t i = 0; i < r.count; ++i) {
        const uint64_t gap = r.Gap(i, big);
        std::memcpy(out + i * sizeof(G), &gap, sizeof(G));
      }
    } else {
      // Every gap fits G here, and a kBigGap entry stands for exactly 2^32 - 1.
      const uint32_t* src = r.gaps.get();
      for (uint64_t i = 0; i < r.count; ++i) {
        const G gap = static_cast<G>(src[i]);
        std::memcpy(out + i * sizeof(G), &gap, sizeof(G));
      }
    }
    const G first = static_cast<G>(first_gaps[p]);
    std::memcpy(out, &first, sizeof(G));
    out += r.count * sizeof(G);
  }
}

// First pass of ApplyDelta: every index in range, strictly increasing.
template <typename G>
absl::Status CheckIndices(const uint8_t* gaps, uint64_t count, uint64_t total) {
  uint64_t idx = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t gap = Get<G>(gaps + i * sizeof(G));
    if (i > 0 && gap == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("delta: record ", i, " repeats index ", idx, " (gap 0)"));
    }
    if (gap >= total - idx) {  // idx < total holds here, so this cannot wrap
      const std::string index =
          gap > ~0ull - idx ? absl::StrCat(idx, " + ", gap) : absl::StrCat(idx + gap);
      return absl::OutOfRangeError(absl::StrCat("delta: record ", i, " index ", index,
                                                " is out of range (", total, " elements)"));
    }
    idx += gap;
  }
  return absl::OkStatus();
}

template <typename G, int E>
void Scatter(const uint8_t* gaps, const uint8_t* values, uint64_t count, uint8_t* dst) {
  uint64_t idx = 0;
  for (uint64_t i = 0; i < count; ++i) {
    idx += Get<G>(gaps + i * sizeof(G));
    std::memcpy(dst + idx * E, values + i * E, E);
  }
}

template <typename G>
void ScatterFor(int elem_size, const uint8_t* gaps, const uint8_t* values, uint64_t count,
                uint8_t* dst) {
  switch (elem_size) {
    case 1:
      return Scatter<G, 1>(gaps, values, count, dst);
    case 2:
      return Scatter<G, 2>(gaps, values, count, dst);
    default:
      return Scatter<G, 4>(gaps, values, count, dst);
  }
}

}  // namespace

absl::StatusOr<DeltaEncoding> EncodeDelta(absl::Span<uint8_t> shadow,
                                          absl::Span<const uint8_t> next, int elem_size,
                                          int threads) {
  if (elem_size != 1 && elem_size != 2 && elem_size != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: element size ", elem_size, " is not 1, 2 or 4 bytes"));
  }
  if (shadow.size() != next.size()) {
    return absl::InvalidArgumentError(absl::StrCat("delta: shadow has ", shadow.size(),
                                                   " bytes but the new version ", next.size()));
  }
  if (next.size() % elem_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta: ", next.size(), " bytes is not a whole number of ", elem_size, "-byte elements"));
  }
  const uint64_t dense = next.size();
  // Bytes the records may take for packed to beat dense.
  const uint64_t budget = dense > kDeltaHeaderBytes ? dense - kDeltaHeaderBytes : 0;
  DeltaEncoding result;
  std::vector<Records> parts;
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  bool within = false;
  switch (elem_size) {
    case 1:
      within = ScanChanges<1>(shadow.data(), next.data(), dense, budget, threads, parts);
      break;
    case 2:
      within = ScanChanges<2>(shadow.data(), next.data(), dense, budget, threads, parts);
      break;
    default:
      within = ScanChanges<4>(shadow.data(), next.data(), dense, budget, threads, parts);
      break;
  }
  uint64_t count = 0, max_gap = 0, prev = 0;
  std::vector<uint64_t> first_gaps(parts.size(), 0);
  for (size_t p = 0; p < parts.size(); ++p) {
    const Records& r = parts[p];
    count += r.count;
    if (r.count == 0) continue;
    first_gaps[p] = r.FirstIndex() - prev;
    max_gap = std::max({max_gap, r.max_gap, first_gaps[p]});
    prev = r.last;
  }
  result.changed_elems = count;
  const int width = WidthFor(max_gap);
  const uint64_t packed_size = kDeltaHeaderBytes + count * (width + elem_size);
  if (!within || packed_size >= dense) {
    if (!within) std::memcpy(shadow.data(), next.data(), dense);  // the scan stopped early
    result.kind = DeltaEncoding::Kind::kDense;
    return result;
  }
  std::vector<uint8_t>& out = result.packed;
  out.resize(packed_size);
  Put<uint32_t>(out, 0, kDeltaMagic);
  Put<uint8_t>(out, 4, kDeltaVersion);
  Put<uint8_t>(out, 5, static_cast<uint8_t>(elem_size));
  Put<uint8_t>(out, 6, static_cast<uint8_t>(width));
  Put<uint8_t>(out, 7, 0);
  Put<uint64_t>(out, 8, dense / elem_size);
  Put<uint64_t>(out, 16, count);
  uint8_t* gaps = out.data() + kDeltaHeaderBytes;
  switch (width) {
    case 1:
      WriteGaps<uint8_t>(parts, first_gaps, gaps);
      break;
    case 2:
      WriteGaps<uint16_t>(parts, first_gaps, gaps);
      break;
    case 4:
      WriteGaps<uint32_t>(parts, first_gaps, gaps);
      break;
    default:
      WriteGaps<uint64_t>(parts, first_gaps, gaps);
      break;
  }
  uint8_t* values = gaps + count * width;
  for (const Records& r : parts) {
    if (r.count == 0) continue;
    std::memcpy(values, r.values.get(), r.count * elem_size);
    values += r.count * elem_size;
  }
  return result;
}

absl::StatusOr<DeltaHeader> ParseDeltaHeader(absl::Span<const uint8_t> packed) {
  if (packed.size() < kDeltaHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("delta: ", packed.size(),
                                                   " bytes is shorter than the ", kDeltaHeaderBytes,
                                                   "-byte header"));
  }
  const uint8_t* p = packed.data();
  if (Get<uint32_t>(p) != kDeltaMagic) {
    return absl::InvalidArgumentError("delta: bad magic (not a weightbeam delta)");
  }
  if (p[4] != kDeltaVersion) {
    return absl::InvalidArgumentError(absl::StrCat("delta: unsupported version ", p[4]));
  }
  DeltaHeader h;
  h.elem_size = p[5];
  h.index_width = p[6];
  h.total_elems = Get<uint64_t>(p + 8);
  h.count = Get<uint64_t>(p + 16);
  if (h.elem_size != 1 && h.elem_size != 2 && h.elem_size != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: element size ", h.elem_size, " is not 1, 2 or 4 bytes"));
  }
  if (h.index_width != 1 && h.index_width != 2 && h.index_width != 4 && h.index_width != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: index width ", h.index_width, " is not 1, 2, 4 or 8 bytes"));
  }
  const uint64_t record = h.index_width + h.elem_size;
  const uint64_t body = packed.size() - kDeltaHeaderBytes;
  if (h.count > body / record || body != h.count * record) {
    return absl::InvalidArgumentError(absl::StrCat("delta: header announces ", h.count,
                                                   " records of ", record, " bytes but ", body,
                                                   " bytes follow"));
  }
  if (h.count > h.total_elems) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: ", h.count, " records for ", h.total_elems, " elements"));
  }
  return h;
}

absl::Status ApplyDelta(absl::Span<const uint8_t> packed, absl::Span<uint8_t> dst) {
  absl::StatusOr<DeltaHeader> h = ParseDeltaHeader(packed);
  if (!h.ok()) return h.status();
  if (h->total_elems > dst.size() / h->elem_size || h->total_elems * h->elem_size != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: encodes ", h->total_elems, " elements of ", h->elem_size,
                     " bytes but the destination has ", dst.size(), " bytes"));
  }
  const uint8_t* gaps = packed.data() + kDeltaHeaderBytes;
  const uint8_t* values = gaps + h->count * h->index_width;
  absl::Status checked;
  switch (h->index_width) {
    case 1:
      checked = CheckIndices<uint8_t>(gaps, h->count, h->total_elems);
      break;
    case 2:
      checked = CheckIndices<uint16_t>(gaps, h->count, h->total_elems);
      break;
    case 4:
      checked = CheckIndices<uint32_t>(gaps, h->count, h->total_elems);
      break;
    default:
      checked = CheckIndices<uint64_t>(gaps, h->count, h->total_elems);
      break;
  }
  if (!checked.ok()) return checked;
  switch (h->index_width) {
    case 1:
      ScatterFor<uint8_t>(h->elem_size, gaps, values, h->count, dst.data());
      break;
    case 2:
      ScatterFor<uint16_t>(h->elem_size, gaps, values, h->count, dst.data());
      break;
    case 4:
      ScatterFor<uint32_t>(h->elem_size, gaps, values, h->count, dst.data());
      break;
    default:
      ScatterFor<uint64_t>(h->elem_size, gaps, values, h->count, dst.data());
      break;
  }
  return absl::OkStatus();
}

}  // namespace wb::delta
