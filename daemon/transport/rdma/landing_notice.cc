#include "daemon/transport/rdma/landing_notice.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace wb::transport::rdma {
namespace {

template <typename T>
void Put(std::string* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

template <typename T>
T Get(const uint8_t* p) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return value;
}

}  // namespace

std::vector<LandedRange> MergeRanges(std::vector<LandedRange> ranges) {
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [](const LandedRange& r) { return r.length == 0; }),
               ranges.end());
  std::sort(ranges.begin(), ranges.end(), [](const LandedRange& a, const LandedRange& b) {
    return a.step != b.step ? a.step < b.step : a.addr < b.addr;
  });
  std::vector<LandedRange> out;
  for (const LandedRange& r : ranges) {
    if (!out.empty() && out.back().step == r.step &&
        r.addr <= out.back().addr + out.back().length) {
      out.back().length =
          std::max(out.back().addr + out.back().length, r.addr + r.length) - out.back().addr;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> EncodeNotices(uint64_t seq,
                                                       const std::vector<LandedRange>& ranges,
                                                       size_t slot_bytes) {
  if (slot_bytes < kNoticeHeaderBytes + kNoticeEntryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdma landing notices: a slot of ", slot_bytes, " bytes holds no entry"));
  }
  if (ranges.size() > kMaxLandedRangesPerBatch) {
    return absl::ResourceExhaustedError(absl::StrCat("rdma landing notices: ", ranges.size(),
                                                     " ranges in one batch (at most ",
                                                     kMaxLandedRangesPerBatch, ")"));
  }
  const size_t per_notice =
      std::min<size_t>((slot_bytes - kNoticeHeaderBytes) / kNoticeEntryBytes, UINT16_MAX);
  const size_t count = std::max<size_t>(1, (ranges.size() + per_notice - 1) / per_notice);
  std::vector<std::string> notices;
  notices.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const size_t first = i * per_notice;
    const size_t entries = std::min(per_notice, ranges.size() - std::min(first, ranges.size()));
    std::string n;
    n.reserve(kNoticeHeaderBytes + entries * kNoticeEntryBytes);
    Put<uint32_t>(&n, kNoticeMagic);
    Put<uint16_t>(&n, kNoticeVersion);
    Put<uint16_t>(&n, static_cast<uint16_t>(entries));
    Put<uint16_t>(&n, static_cast<uint16_t>(i));
    Put<uint16_t>(&n, static_cast<uint16_t>(count));
    Put<uint32_t>(&n, 0);
    Put<uint64_t>(&n, seq);
    for (size_t e = first; e < first + entries; ++e) {
      Put<uint64_t>(&n, ranges[e].step);
      Put<uint64_t>(&n, ranges[e].addr);
      Put<uint64_t>(&n, ranges[e].length);
    }
    notices.push_back(std::move(n));
  }
  return notices;
}

void NoticeAssembler::Reset() {
  active_ = false;
  seq_ = 0;
  count_ = 0;
  received_ = 0;
  seen_.clear();
  ranges_.clear();
}

absl::Status NoticeAssembler::Add(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (size < kNoticeHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("landing notice of ", size, " bytes is shorter than its header"));
  }
  if (Get<uint32_t>(p) != kNoticeMagic || Get<uint16_t>(p + 4) != kNoticeVersion) {
    return absl::InvalidArgumentError("landing notice with a wrong magic number or version");
  }
  const uint16_t entries = Get<uint16_t>(p + 6);
  const uint16_t index = Get<uint16_t>(p + 8);
  const uint16_t count = Get<uint16_t>(p + 10);
  const uint64_t seq = Get<uint64_t>(p + 16);
  if (size != kNoticeHeaderBytes + size_t{entries} * kNoticeEntryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("landing notice says ", entries, " entries but carries ", size, " bytes"));
  }
  if (count == 0 || index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("landing notice ", index, " of ", count, " is out of range"));
  }
  if (count > kMaxLandedRangesPerBatch) {
    return absl::InvalidArgumentError(absl::StrCat("landing notice says its batch has ", count,
                                                   " notices (at most ", kMaxLandedRangesPerBatch,
                                                   ")"));
  }
  std::vector<LandedRange> ranges;
  ranges.reserve(entries);
  for (uint16_t e = 0; e < entries; ++e) {
    const uint8_t* q = p + kNoticeHeaderBytes + size_t{e} * kNoticeEntryBytes;
    LandedRange r{Get<uint64_t>(q), Get<uint64_t>(q + 8), Get<uint64_t>(q + 16)};
    if (r.length == 0 || r.addr + r.length < r.addr) {
      return absl::InvalidArgumentError(absl::StrCat("landing notice range [", r.addr, ", +",
                                                     r.length, ") is empty or wraps around"));
    }
    ranges.push_back(r);
  }
  if (!active_ || seq != seq_) {
    // A new batch: whatever an earlier one left (its immediate never came) is dropped.
    Reset();
    active_ = true;
    seq_ = seq;
    count_ = count;
    seen_.assign(count, false);
  }
  if (count != count_ || seen_[index]) {
    Reset();
    return absl::InvalidArgumentError(absl::StrCat(
        "landing notice ", index, " of ", count, " for batch ", seq,
        " contradicts the notices before it (count or duplicate); the batch reports nothing"));
  }
  if (ranges_.size() + ranges.size() > kMaxLandedRangesPerBatch) {
    Reset();
    return absl::InvalidArgumentError(absl::StrCat("landing notices of batch ", seq,
                                                   " carry more than ", kMaxLandedRangesPerBatch,
                                                   " ranges; the batch reports nothing"));
  }
  seen_[index] = true;
  ++received_;
  ranges_.insert(ranges_.end(), ranges.begin(), ranges.end());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LandedRange>> NoticeAssembler::Close() {
  if (!active_) {
    Reset();
    return absl::NotFoundError("a batch closed without a landing notice");
  }
  if (received_ != count_) {
    const std::string error = absl::StrCat("batch ", seq_, " closed with ", received_, " of ",
                                           count_, " landing notices");
    Reset();
    return absl::FailedPreconditionError(error);
  }
  std::vector<LandedRange> out = std::move(ranges_);
  Reset();
  return out;
}

}  // namespace wb::transport::rdma
