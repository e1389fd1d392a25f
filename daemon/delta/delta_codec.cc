// Delta encoder and applier: 32-byte word scans skip unchanged runs, only differing words
// are looked at element by element.
#include "daemon/delta/delta_codec.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>

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

// Scans bytes [begin, end) of the buffers (begin a multiple of 8): collects the indices of
// changed elements and copies changed words into the shadow. Several scanners run on
// consecutive ranges at once and share `found`, the number of records found by all of them.
// A scanner stops (Run returns false) as soon as the records found make dense certain, which
// keeps memory bounded: all records at 1-byte gaps, or its own records at the narrowest width
// their gaps allow, fill `budget` bytes.
template <int E>
class ChangeScanner {
 public:
  ChangeScanner(uint8_t* shadow, const uint8_t* next, size_t begin, size_t end, uint64_t budget,
                std::atomic<uint64_t>& found, std::vector<uint64_t>& changed)
      : shadow_(shadow),
        next_(next),
        begin_(begin),
        end_(end),
        budget_(budget),
        found_(found),
        changed_(changed),
        last_(begin / E) {}

  bool Run() {
    size_t off = begin_;
    for (; off + 32 <= end_; off += 32) {
      const uint64_t x0 = Load64(shadow_ + off) ^ Load64(next_ + off);
      const uint64_t x1 = Load64(shadow_ + off + 8) ^ Load64(next_ + off + 8);
      const uint64_t x2 = Load64(shadow_ + off + 16) ^ Load64(next_ + off + 16);
      const uint64_t x3 = Load64(shadow_ + off + 24) ^ Load64(next_ + off + 24);
      if ((x0 | x1 | x2 | x3) == 0) continue;
      if (!Word(off, x0) || !Word(off + 8, x1) || !Word(off + 16, x2) || !Word(off + 24, x3)) {
        return false;
      }
    }
    for (; off + 8 <= end_; off += 8) {
      if (!Word(off, Load64(shadow_ + off) ^ Load64(next_ + off))) return false;
    }
    const size_t before = changed_.size();
    for (; off < end_; off += E) {
      if (std::memcmp(shadow_ + off, next_ + off, E) != 0) {
        Add(off / E);
        std::memcpy(shadow_ + off, next_ + off, E);
      }
    }
    return WithinBudget(changed_.size() - before);
  }

 private:
  void Add(uint64_t idx) {
    // For the first record of a range the true gap (from the previous range's last record)
    // is at least this large, so the width check below stays a lower bound.
    max_gap_ = std::max(max_gap_, idx - last_);
    last_ = idx;
    changed_.push_back(idx);
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
    return all * (1 + E) < budget_ && changed_.size() * (WidthFor(max_gap_) + E) < budget_;
  }

  static constexpr uint64_t kPublishBatch = 4096;

  bool Word(size_t off, uint64_t diff) {
    if (diff == 0) return true;
    constexpr uint64_t kMask = (1ull << (8 * E)) - 1;
    const size_t before = changed_.size();
    for (int k = 0; k < 8 / E; ++k) {
      if ((diff >> (8 * E * k)) & kMask) Add(off / E + k);
    }
    std::memcpy(shadow_ + off, next_ + off, 8);
    return WithinBudget(changed_.size() - before);
  }

  uint8_t* shadow_;
  const uint8_t* next_;
  size_t begin_;
  size_t end_;
  uint64_t budget_;
  std::atomic<uint64_t>& found_;
  std::vector<uint64_t>& changed_;
  uint64_t last_;
  uint64_t max_gap_ = 0;
  uint64_t unpublished_ = 0;
};

// Scans the whole buffer on up to `threads` threads; `changed` gets the indices in order.
// Returns false when a scanner stopped early (dense is certain).
template <int E>
bool ScanChanges(uint8_t* shadow, const uint8_t* next, size_t bytes, uint64_t budget, int threads,
                 std::vector<uint64_t>& changed) {
  const size_t chunks = std::max<size_t>(
      1, std::min<size_t>(static_cast<size_t>(threads), bytes / kMinBytesPerThread));
  // Ranges start on 32-byte boundaries so each thread's word scan stays aligned to elements.
  const size_t chunk = (bytes / chunks + 31) / 32 * 32;
  std::atomic<uint64_t> found{0};
  if (chunks == 1) {
    return ChangeScanner<E>(shadow, next, 0, bytes, budget, found, changed).Run();
  }
  std::vector<std::vector<uint64_t>> parts(chunks);
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
  size_t total = 0;
  for (const auto& part : parts) total += part.size();
  changed.reserve(total);
  for (const auto& part : parts) changed.insert(changed.end(), part.begin(), part.end());
  return std::all_of(within.begin(), within.end(), [](char w) { return w != 0; });
}

template <typename G>
void WriteGaps(const std::vector<uint64_t>& changed, uint8_t* out) {
  uint64_t prev = 0;
  for (uint64_t idx : changed) {
    const G gap = static_cast<G>(idx - prev);
    std::memcpy(out, &gap, sizeof(G));
    out += sizeof(G);
    prev = idx;
  }
}

template <int E>
void WriteValues(const std::vector<uint64_t>& changed, const uint8_t* next, uint8_t* out) {
  for (uint64_t idx : changed) {
    std::memcpy(out, next + idx * E, E);
    out += E;
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
  std::vector<uint64_t> changed;
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  bool within = false;
  switch (elem_size) {
    case 1:
      within = ScanChanges<1>(shadow.data(), next.data(), dense, budget, threads, changed);
      break;
    case 2:
      within = ScanChanges<2>(shadow.data(), next.data(), dense, budget, threads, changed);
      break;
    default:
      within = ScanChanges<4>(shadow.data(), next.data(), dense, budget, threads, changed);
      break;
  }
  result.changed_elems = changed.size();
  uint64_t max_gap = 0, prev = 0;
  for (uint64_t idx : changed) {
    max_gap = std::max(max_gap, idx - prev);
    prev = idx;
  }
  const int width = WidthFor(max_gap);
  const uint64_t packed_size = kDeltaHeaderBytes + changed.size() * (width + elem_size);
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
  Put<uint64_t>(out, 16, changed.size());
  uint8_t* gaps = out.data() + kDeltaHeaderBytes;
  switch (width) {
    case 1:
      WriteGaps<uint8_t>(changed, gaps);
      break;
    case 2:
      WriteGaps<uint16_t>(changed, gaps);
      break;
    case 4:
      WriteGaps<uint32_t>(changed, gaps);
      break;
    default:
      WriteGaps<uint64_t>(changed, gaps);
      break;
  }
  uint8_t* values = gaps + changed.size() * width;
  switch (elem_size) {
    case 1:
      WriteValues<1>(changed, next.data(), values);
      break;
    case 2:
      WriteValues<2>(changed, next.data(), values);
      break;
    default:
      WriteValues<4>(changed, next.data(), values);
      break;
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
