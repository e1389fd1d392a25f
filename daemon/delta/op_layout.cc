#include "daemon/delta/op_layout.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "daemon/delta/delta_codec.h"

namespace wb::delta {

namespace v1 = weightbeam::v1;

namespace {

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

uint64_t Mix(uint64_t h) {
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ull;
  h ^= h >> 32;
  return h;
}

uint64_t GapAt(const uint8_t* gaps, int width, uint64_t i) {
  switch (width) {
    case 1:
      return gaps[i];
    case 2:
      return Get<uint16_t>(gaps + 2 * i);
    case 4:
      return Get<uint32_t>(gaps + 4 * i);
    default:
      return Get<uint64_t>(gaps + 8 * i);
  }
}

// Second pass (indices already checked): copies each record into its segment.
template <int W, int E>
void Scatter(const uint8_t* gaps, const uint8_t* values, uint64_t count, const OpLayout& layout,
             uint8_t* dst_region, uint8_t* scale_region) {
  const Segment* seg = layout.segments.data();
  const Segment* end = seg + layout.segments.size();
  uint64_t index = 0;
  for (uint64_t i = 0; i < count; ++i) {
    index += GapAt(gaps, W, i);
    const uint64_t byte = index * E;
    while (seg != end && byte >= seg->flat_offset + seg->length) ++seg;
    if (seg == end) return;
    if (byte < seg->flat_offset) continue;  // padding between data and scales
    uint8_t* base = seg->scales ? scale_region : dst_region;
    std::memcpy(base + seg->dst_offset + (byte - seg->flat_offset), values + i * E, E);
  }
}

template <int E>
void ScatterWidth(int width, const uint8_t* gaps, const uint8_t* values, uint64_t count,
                  const OpLayout& layout, uint8_t* dst, uint8_t* scales) {
  switch (width) {
    case 1:
      return Scatter<1, E>(gaps, values, count, layout, dst, scales);
    case 2:
      return Scatter<2, E>(gaps, values, count, layout, dst, scales);
    case 4:
      return Scatter<4, E>(gaps, values, count, layout, dst, scales);
    default:
      return Scatter<8, E>(gaps, values, count, layout, dst, scales);
  }
}

}  // namespace

OpLayout LayoutOf(const v1::TransferOp& op) {
  OpLayout l;
  const uint64_t dst_size = tensor::DTypeBytes(op.dst_dtype());
  const uint64_t dst_row = op.row_elems() * dst_size;
  const uint64_t data = dst_row * op.rows();
  const uint64_t dst_stride = op.dst_stride() ? op.dst_stride() : dst_row;
  const bool fp8 = op.transform() == v1::TRANSFORM_FP8_BLOCK;
  l.elem_size = fp8 ? 1 : (dst_size == 1 || dst_size == 2 ? static_cast<int>(dst_size) : 4);
  if (dst_stride == dst_row) {
    l.segments.push_back({0, data, op.dst_offset(), false});
  } else {
    for (uint64_t r = 0; r < op.rows(); ++r) {
      l.segments.push_back({r * dst_row, dst_row, op.dst_offset() + r * dst_stride, false});
    }
  }
  l.flat_bytes = data;
  l.dense_bytes = data;
  if (fp8) {
    const uint64_t block_rows = (op.rows() + 127) / 128;
    const uint64_t scale_row = (op.row_elems() + 127) / 128 * sizeof(float);
    const uint64_t scale_stride = op.scale_stride() ? op.scale_stride() : scale_row;
    const uint64_t base = (data + 15) / 16 * 16;
    for (uint64_t r = 0; r < block_rows; ++r) {
      l.segments.push_back(
          {base + r * scale_row, scale_row, op.scale_offset() + r * scale_stride, true});
    }
    l.flat_bytes = base + block_rows * scale_row;
    l.dense_bytes += block_rows * scale_row;
  }
  return l;
}

void WriteSlotHeader(const SlotHeader& h, uint8_t* at) {
  const uint64_t words[5] = {h.magic, h.version, h.nonce, h.op_id, h.payload_bytes};
  std::memcpy(at, words, sizeof(words));
}

SlotHeader ReadSlotHeader(const uint8_t* at) {
  uint64_t words[5];
  std::memcpy(words, at, sizeof(words));
  return SlotHeader{words[0], words[1], words[2], words[3], words[4]};
}

uint64_t HashBytes(const uint8_t* p, size_t n, uint64_t h) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) h = (h ^ Get<uint64_t>(p + i)) * 0x9e3779b97f4a7c15ull;
  uint64_t tail = 0;
  if (i < n) std::memcpy(&tail, p + i, n - i);
  return Mix((h ^ tail ^ n) * 0x9e3779b97f4a7c15ull);
}

uint64_t HashFlat(const OpLayout& layout, const uint8_t* flat) {
  uint64_t h = 0x243f6a8885a308d3ull;
  for (const Segment& s : layout.segments) h = HashBytes(flat + s.flat_offset, s.length, h);
  return h;
}

uint64_t HashDestination(const OpLayout& layout, const uint8_t* dst_region,
                         const uint8_t* scale_region) {
  uint64_t h = 0x243f6a8885a308d3ull;
  for (const Segment& s : layout.segments) {
    const uint8_t* base = s.scales ? scale_region : dst_region;
    h = HashBytes(base + s.dst_offset, s.length, h);
  }
  return h;
}

namespace {

struct CheckedDelta {
  DeltaHeader header;
  const uint8_t* gaps = nullptr;
  const uint8_t* values = nullptr;
};

// Header against the layout, then every index in range and strictly increasing.
absl::StatusOr<CheckedDelta> CheckDelta(absl::Span<const uint8_t> packed, const OpLayout& layout) {
  auto header = ParseDeltaHeader(packed);
  if (!header.ok()) return header.status();
  if (header->elem_size != layout.elem_size ||
      header->total_elems * static_cast<uint64_t>(header->elem_size) != layout.flat_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta covers ", header->total_elems, " elements of ", header->elem_size,
        " byte(s), the operation has ", layout.flat_bytes, " bytes of ", layout.elem_size));
  }
  CheckedDelta d;
  d.header = *header;
  d.gaps = packed.data() + kDeltaHeaderBytes;
  d.values = d.gaps + header->count * header->index_width;
  uint64_t index = 0;
  for (uint64_t i = 0; i < header->count; ++i) {
    const uint64_t gap = GapAt(d.gaps, header->index_width, i);
    if (i > 0 && gap == 0) {
      return absl::InvalidArgumentError(absl::StrCat("delta record ", i, " repeats index ", index));
    }
    if (gap >= header->total_elems - index) {  // index < total_elems holds here
      return absl::OutOfRangeError(
          absl::StrCat("delta record ", i, " points past element ", header->total_elems));
    }
    index += gap;
  }
  return d;
}

}  // namespace

absl::Status ApplyToDestination(absl::Span<const uint8_t> packed, const OpLayout& layout,
                                uint8_t* dst_region, uint8_t* scale_region) {
  auto d = CheckDelta(packed, layout);
  if (!d.ok()) return d.status();
  const DeltaHeader& h = d->header;
  // Fast path for host memory: scatter straight from the packed records (no lists built).
  switch (layout.elem_size) {
    case 1:
      ScatterWidth<1>(h.index_width, d->gaps, d->values, h.count, layout, dst_region, scale_region);
      break;
    case 2:
      ScatterWidth<2>(h.index_width, d->gaps, d->values, h.count, layout, dst_region, scale_region);
      break;
    default:
      ScatterWidth<4>(h.index_width, d->gaps, d->values, h.count, layout, dst_region, scale_region);
  }
  return absl::OkStatus();
}

absl::StatusOr<ScatterList> ResolveDelta(absl::Span<const uint8_t> packed, const OpLayout& layout) {
  auto d = CheckDelta(packed, layout);
  if (!d.ok()) return d.status();
  const DeltaHeader& h = d->header;
  const uint64_t e = static_cast<uint64_t>(layout.elem_size);
  ScatterList list;
  list.elem_size = layout.elem_size;
  list.data_offsets.reserve(h.count);
  list.data_values.reserve(h.count * e);
  const Segment* seg = layout.segments.data();
  const Segment* end = seg + layout.segments.size();
  uint64_t index = 0;
  for (uint64_t i = 0; i < h.count; ++i) {
    index += GapAt(d->gaps, h.index_width, i);
    const uint64_t byte = index * e;
    while (seg != end && byte >= seg->flat_offset + seg->length) ++seg;
    if (seg == end) break;
    if (byte < seg->flat_offset) continue;  // padding between data and scales
    auto& offsets = seg->scales ? list.scale_offsets : list.data_offsets;
    auto& values = seg->scales ? list.scale_values : list.data_values;
    offsets.push_back(seg->dst_offset + (byte - seg->flat_offset));
    values.insert(values.end(), d->values + i * e, d->values + (i + 1) * e);
  }
  return list;
}

void ScatterHost(const ScatterList& list, uint8_t* dst_region, uint8_t* scale_region) {
  const size_t e = static_cast<size_t>(list.elem_size);
  for (size_t i = 0; i < list.data_offsets.size(); ++i) {
    std::memcpy(dst_region + list.data_offsets[i], list.data_values.data() + i * e, e);
  }
  for (size_t i = 0; i < list.scale_offsets.size(); ++i) {
    std::memcpy(scale_region + list.scale_offsets[i], list.scale_values.data() + i * e, e);
  }
}

}  // namespace wb::delta
