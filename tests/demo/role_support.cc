#include "tests/demo/role_support.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/transform/transform.h"

namespace wb::demo {

namespace v1 = weightbeam::v1;
using planner::TensorEntry;

uint64_t EntryElements(const TensorEntry& e) {
  uint64_t n = 1;
  if (e.shard.empty()) {
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
  } else {
    for (const auto& s : e.shard) n *= static_cast<uint64_t>(s.size);
  }
  return n;
}

uint64_t EntryBytes(const TensorEntry& e) {
  return EntryElements(e) * static_cast<uint64_t>(planner::DTypeBytes(e.dtype));
}

uint64_t Align64(uint64_t n) { return (n + 63) / 64 * 64; }

uint64_t Total(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Rect ShardRect(const TensorEntry& e) {
  if (e.shape.size() < 2) {
    const int64_t n = e.shape.empty() ? 1 : e.shape[0];
    if (e.shard.empty()) return {0, 1, 0, n, n};
    return {0, 1, e.shard[0].start, e.shard[0].size, n};
  }
  const int64_t cols = e.shape[1];
  if (e.shard.empty()) return {0, e.shape[0], 0, cols, cols};
  return {e.shard[0].start, e.shard[0].size, e.shard[1].start, e.shard[1].size, cols};
}

client::TensorInfo InfoOf(const TensorEntry& e) {
  client::TensorInfo t;
  t.name = e.name;
  t.dtype = e.dtype;
  t.global_shape = e.shape;
  for (const auto& s : e.shard) t.shard.emplace_back(s.start, s.size);
  return t;
}

absl::StatusOr<Registered> Allocate(const std::vector<TensorEntry>& entries,
                                    const std::string& name) {
  uint64_t total = 0;
  std::vector<uint64_t> offsets;
  for (const auto& e : entries) {
    offsets.push_back(total);
    total += Align64(EntryBytes(e));
  }
  auto buf = client::SharedBuffer::Create(std::max<uint64_t>(total, 64), name);
  if (!buf.ok()) return buf.status();
  return Registered{std::move(*buf), offsets};
}

bool StdinClosed() {
  pollfd p{0, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char c;
  return read(0, &c, 1) <= 0;  // the driver only closes our stdin, it sends nothing
}

std::string FirstMismatch(const std::string& name, const uint8_t* want, const uint8_t* got,
                          uint64_t bytes) {
  if (std::memcmp(want, got, bytes) == 0) return "";
  for (uint64_t i = 0; i < bytes; ++i) {
    if (want[i] != got[i]) {
      char buf[128];
      std::snprintf(buf, sizeof(buf), " at byte %llu: expected 0x%02x, found 0x%02x",
                    static_cast<unsigned long long>(i), want[i], got[i]);
      return name + buf;
    }
  }
  return "";
}

std::string CheckFp8(const TensorEntry& e, const std::vector<uint16_t>& want, uint64_t rows,
                     uint64_t cols, const uint8_t* got, const TensorEntry* scale,
                     const uint8_t* scale_got, uint64_t* checked) {
  const transform::TransformDesc d{transform::Kind::kFp8Block, transform::DType::kBF16,
                                   transform::DType::kF8E4M3, rows, cols};
  std::vector<uint8_t> fp8(rows * cols);
  std::vector<float> scales(transform::ScaleRows(d) * transform::ScaleCols(d));
  if (auto s = transform::ApplyTransformCpu(d, want.data(), fp8.data(), scales.data()); !s.ok()) {
    return std::string(s.message());
  }
  std::string mismatch = FirstMismatch(e.name, fp8.data(), got, fp8.size());
  *checked += fp8.size();
  if (!mismatch.empty() || scale == nullptr) return mismatch;
  if (EntryBytes(*scale) != scales.size() * 4) {
    mismatch = absl::StrCat(scale->name, ": ", EntryBytes(*scale), " bytes registered, ",
                            scales.size() * 4, " expected");
  } else {
    mismatch = FirstMismatch(scale->name, reinterpret_cast<const uint8_t*>(scales.data()),
                             scale_got, scales.size() * 4);
  }
  *checked += scales.size() * 4;
  return mismatch;
}

}  // namespace wb::demo
