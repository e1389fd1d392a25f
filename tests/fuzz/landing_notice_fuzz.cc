// libFuzzer target for the rdma landing notices a relay receives from its peers
// (daemon/transport/rdma/landing_notice.h): the input is a sequence of records, each a length
// byte and that many bytes (a notice, copied into a buffer of exactly that size so ASan sees any
// read past it), or a length byte 0xff (the batch's immediate: Close). Asserts what the
// receiver relies on: a closed batch only reports non-empty, non-wrapping ranges; a notice that
// Add refused leaves nothing behind for Close to report that was not added before it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "daemon/transport/rdma/landing_notice.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

constexpr char kTarget[] = "landing_notice_fuzz";

using wb::transport::rdma::LandedRange;
using wb::transport::rdma::NoticeAssembler;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  NoticeAssembler assembler;
  size_t accepted_entries = 0;  // entries of notices accepted since the last Close
  size_t at = 0;
  while (at < size) {
    const uint8_t n = data[at++];
    if (n == 0xff) {
      auto closed = assembler.Close();
      if (closed.ok()) {
        CHECK_INVARIANT(closed->size() <= accepted_entries);
        for (const LandedRange& r : *closed) {
          CHECK_INVARIANT(r.length > 0);
          CHECK_INVARIANT(r.addr + r.length > r.addr);
        }
      }
      accepted_entries = 0;
      continue;
    }
    const size_t len = std::min<size_t>(n, size - at);
    auto copy = std::make_unique<uint8_t[]>(len ? len : 1);
    if (len) std::memcpy(copy.get(), data + at, len);
    at += len;
    if (assembler.Add(copy.get(), len).ok()) {
      CHECK_INVARIANT(len >= wb::transport::rdma::kNoticeHeaderBytes);
      accepted_entries +=
          (len - wb::transport::rdma::kNoticeHeaderBytes) / wb::transport::rdma::kNoticeEntryBytes;
    }  // a refused notice adds nothing (it may drop the set gathered so far)
  }
  return 0;
}
