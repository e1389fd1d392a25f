// Pure planning of a write batch onto queue pairs: splits each write across the NIC rails,
// cuts the pieces into work requests of at most `chunk_bytes` (verbs lengths are 32-bit) and
// spreads them over the queue pairs of each rail. Also the 32-bit immediate that tells the
// receiver how many bytes a batch carried.
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/transport/transport.h"

namespace wb::transport::rdma {

// One work request's worth of a write.
struct Chunk {
  int rail = 0;  // index into the transport's devices
  int qp = 0;    // queue pair within the rail
  uint64_t local_region = 0;
  uint64_t local_offset = 0;
  uint64_t remote_region = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

struct ChunkPlanOptions {
  int rails = 1;
  int qps_per_rail = 1;
  uint64_t chunk_bytes = uint64_t{1} << 20;  // capped at 1 GiB
  // Writes shorter than rails * this go whole to one rail: tiny pieces cost more than they gain.
  uint64_t min_rail_split_bytes = 64 << 10;
};

// Chunks in posting order; their lengths add up to the ops' lengths. Zero-length ops vanish.
std::vector<Chunk> PlanChunks(const std::vector<WriteOp>& ops, const ChunkPlanOptions& options);

// The immediate of a batch's last write: bit 31 clear: the exact byte count (< 2 GiB);
// bit 31 set: the count in KiB, rounded up (batches up to 2 TiB).
uint32_t EncodeBatchBytes(uint64_t bytes);
uint64_t DecodeBatchBytes(uint32_t imm);

}  // namespace wb::transport::rdma
