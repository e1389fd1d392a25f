#include "daemon/transport/rdma/chunk_plan.h"

#include <algorithm>

namespace wb::transport::rdma {

std::vector<Chunk> PlanChunks(const std::vector<WriteOp>& ops, const ChunkPlanOptions& options) {
  const int rails = std::max(1, options.rails);
  const int qps = std::max(1, options.qps_per_rail);
  const uint64_t chunk_bytes = std::clamp<uint64_t>(options.chunk_bytes, 4096, uint64_t{1} << 30);
  std::vector<Chunk> chunks;
  std::vector<int> next_qp(rails, 0);  // round-robin per rail across the whole batch
  int next_small_rail = 0;
  for (const WriteOp& op : ops) {
    if (op.length == 0) continue;
    // How many rails this op is spread over, and each rail's contiguous share.
    int op_rails = op.length >= rails * options.min_rail_split_bytes ? rails : 1;
    int first_rail = 0;
    if (op_rails == 1) {
      first_rail = next_small_rail;
      next_small_rail = (next_small_rail + 1) % rails;
    }
    uint64_t share = (op.length + op_rails - 1) / op_rails;
    share = (share + 4095) / 4096 * 4096;  // page-aligned boundaries between rails
    uint64_t done = 0;
    for (int r = 0; r < op_rails && done < op.length; ++r) {
      int rail = (first_rail + r) % rails;
      uint64_t rail_end = std::min(op.length, done + share);
      while (done < rail_end) {
        uint64_t len = std::min(chunk_bytes, rail_end - done);
        Chunk c;
        c.rail = rail;
        c.qp = next_qp[rail];
        next_qp[rail] = (next_qp[rail] + 1) % qps;
        c.local_region = op.local_region;
        c.local_offset = op.local_offset + done;
        c.remote_region = op.remote_region;
        c.remote_offset = op.remote_offset + done;
        c.length = len;
        chunks.push_back(c);
        done += len;
      }
    }
  }
  return chunks;
}

uint32_t EncodeBatchBytes(uint64_t bytes) {
  if (bytes < (uint64_t{1} << 31)) return static_cast<uint32_t>(bytes);
  uint64_t kib = (bytes + 1023) / 1024;
  return static_cast<uint32_t>(std::min<uint64_t>(kib, (uint64_t{1} << 31) - 1)) | (1u << 31);
}

uint64_t DecodeBatchBytes(uint32_t imm) {
  if ((imm & (1u << 31)) == 0) return imm;
  return uint64_t{imm & ~(1u << 31)} * 1024;
}

}  // namespace wb::transport::rdma
