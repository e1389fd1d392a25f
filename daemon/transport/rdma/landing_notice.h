// Landing notices: how an rdma receiver learns which of its bytes a batch of one-sided writes
// carried, so that it can report them landed (a relay forwards them: executor/landing_tracker.h).
//
// The sender, once every write of a batch has been acknowledged, SENDs (two-sided, into receive
// buffers the receiver posted: nothing here is remotely writable memory) one or more notices on
// the queue pair that then carries the batch's closing RDMA_WRITE_WITH_IMM, right before it.
// A queue pair delivers in order, so the receiver holds the notices of that queue pair until the
// immediate is polled: only then has every byte of the batch been placed (the batch's other
// writes were acknowledged before the notices and the immediate were posted), and only then are
// the notices' ranges reported landed. A batch whose immediate never comes (it failed, it timed
// out) reports nothing: the next batch's notices replace its incomplete set.
//
// Wire format (little-endian), one notice per SEND of at most `slot_bytes`:
//   header (24 bytes): magic u32 "WBLN", version u16 (1), entries u16, index u16, count u16,
//                      reserved u32, batch sequence u64
//   entries x 24 bytes: step u64, address u64 (the receiver's own virtual address: the address
//                      its region descriptor announced, plus the offset), length u64
// A batch's notices share the sequence number and are numbered index 0..count-1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wb::transport::rdma {

struct LandedRange {
  uint64_t step = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  bool operator==(const LandedRange& o) const {
    return step == o.step && addr == o.addr && length == o.length;
  }
};

constexpr uint32_t kNoticeMagic = 0x4e4c4257;  // "WBLN" little-endian
constexpr uint16_t kNoticeVersion = 1;
constexpr size_t kNoticeHeaderBytes = 24;
constexpr size_t kNoticeEntryBytes = 24;
// The most ranges (and notices) one batch may carry: one range per write, and the rdma peer
// posts a longer Write (a strided op is one write per row) as several batches (SplitBatch).
// The bound keeps what a peer can make the receiver hold, and check on its poller thread,
// small whatever it sends.
constexpr size_t kMaxLandedRangesPerBatch = 4096;

// Sorted by (step, address); overlapping or touching ranges of one step merged; empty ones gone.
std::vector<LandedRange> MergeRanges(std::vector<LandedRange> ranges);

// The notices of batch `seq`: at least one (an empty batch sends one with no entries), each at
// most `slot_bytes`. Fails when there are more than kMaxLandedRangesPerBatch ranges or a slot
// holds none.
absl::StatusOr<std::vector<std::string>> EncodeNotices(uint64_t seq,
                                                       const std::vector<LandedRange>& ranges,
                                                       size_t slot_bytes);

// One queue pair's notices, gathered until the immediate that closes their batch is polled.
// Never trusts the bytes: malformed notices are refused with an error and change nothing.
class NoticeAssembler {
 public:
  // A notice arrived (the `size` bytes a receive completion reported).
  absl::Status Add(const void* data, size_t size);
  // The batch's immediate was polled on this queue pair: the ranges of the batch whose notices
  // all arrived before it, and the assembler starts afresh. NOT_FOUND when no notice came (a
  // sender without landing notices), FAILED_PRECONDITION when the set is incomplete or was
  // spoiled: nothing is reported then.
  absl::StatusOr<std::vector<LandedRange>> Close();
  // Forgets what was gathered (the connection ended).
  void Reset();

 private:
  bool active_ = false;
  uint64_t seq_ = 0;
  uint16_t count_ = 0;
  uint16_t received_ = 0;
  std::vector<bool> seen_;
  std::vector<LandedRange> ranges_;
};

}  // namespace wb::transport::rdma
