// The planner's input: what each agent holds (tensors, shards, regions, NIC rails), as plain
// structs with no I/O. The controller fills these from the agents' reported layouts
// (plan_proto.h converts); tests and benchmarks build them directly (models.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightbeam/v1/types.pb.h"

namespace wb::planner {

using DType = weightbeam::v1::DType;
using Transform = weightbeam::v1::Transform;

// The most dimensions a tensor may have.
inline constexpr int kMaxDims = 8;
// FP8 block scaling works on 128x128 blocks (DeepSeek-V3 layout).
inline constexpr int64_t kFp8Block = 128;

enum class Role : uint8_t { kTrainer, kInference };

// This buffer holds global[start, start + size) along one dimension.
struct DimSlice {
  int64_t start = 0;
  int64_t size = 0;
};

// Trainer rank `rank` (of data-parallel replica `replica`), or rank `rank` of inference
// replica `replica`.
struct Owner {
  Role role = Role::kTrainer;
  int32_t rank = 0;
  int32_t replica = 0;
};

// One registered tensor buffer. `shard` empty means the full tensor; otherwise one slice per
// dimension, held densely in row-major order at offset 0 of region `region`.
struct TensorEntry {
  std::string name;
  DType dtype = weightbeam::v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  std::vector<DimSlice> shard;
  Owner owner;
  uint64_t region = 0;
  uint64_t region_bytes = 0;
  int32_t gpu = -1;  // -1: host memory; else the GPU index on the agent ("cuda:N")
};

struct Nic {
  std::string name;
  double gbps = 0;  // nominal GB/s; 0: use the cost model's default
};

struct AgentLayout {
  std::string name;
  std::vector<Nic> nics;
  std::vector<TensorEntry> tensors;
};

// Bytes per element; 0 for an unknown dtype.
int64_t DTypeBytes(DType dtype);
// "bf16", "f8_e4m3", ...
const char* DTypeName(DType dtype);
// "[2048, 1024]"
std::string FormatShape(const std::vector<int64_t>& shape);
// "[0:128, 0:1024]" (start:end per dimension); the full tensor when `shard` is empty.
std::string FormatSlice(const std::vector<DimSlice>& shard, const std::vector<int64_t>& shape);
// "trainer rank 3 on agent trainer-000", "inference replica 1 rank 2 on agent infer-003"
std::string FormatOwner(const Owner& owner, const std::string& agent);
// "host" or "cuda:N" <-> -1 / N. Returns false for anything else.
bool ParseLocation(const std::string& location, int32_t* gpu);
std::string FormatLocation(int32_t gpu);

}  // namespace wb::planner
