// A reference applier for planner tests: synthetic source buffers whose every element is a
// function of its tensor's name and global position (so any source layout of the same tensors
// holds the same values), and every executed op of a plan applied to fresh destination buffers
// (per-row copy; FP8 as a stand-in quantizer whose output depends on each 128x128 block's amax,
// so any change of block grouping shows). Written here, independently of the executor.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/planner/layout.h"
#include "common/planner/plan.h"

namespace wb::planner::testing {

// Sources by (agent, tensor); destinations by (agent, region): the parts (views) of one engine
// parameter share its buffer.
using Buffers = std::map<std::pair<int64_t, int64_t>, std::vector<uint8_t>>;

inline float Bf16ToFloat(const uint8_t* p) {
  uint32_t bits = (uint32_t{p[1]} << 24) | (uint32_t{p[0]} << 16);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Sources: each element a function of its tensor's name and global position (so replicas of a
// slice hold the same bytes, whichever one a plan reads), a finite BF16 value (random sign and
// mantissa, exponent in [-8, 7]) or random bits for other dtypes.
inline Buffers Sources(const std::vector<AgentLayout>& agents) {
  Buffers out;
  for (size_t a = 0; a < agents.size(); ++a) {
    for (size_t t = 0; t < agents[a].tensors.size(); ++t) {
      const TensorEntry& e = agents[a].tensors[t];
      if (e.owner.role != Role::kTrainer) continue;
      const uint64_t name_hash = std::hash<std::string>()(e.name);
      const size_t n = e.shape.size();
      const size_t eb = DTypeBytes(e.dtype);
      std::vector<int64_t> start(n, 0), size(e.shape);
      for (size_t d = 0; d < e.shard.size(); ++d)
        start[d] = e.shard[d].start, size[d] = e.shard[d].size;
      int64_t count = 1;
      for (int64_t s : size) count *= s;
      std::vector<uint8_t>& b = out[{int32_t(a), int32_t(t)}];
      b.assign(e.region_bytes, 0);
      for (int64_t i = 0; i < count; ++i) {
        int64_t rest = i, global = 0, pitch = 1;
        for (size_t d = n; d-- > 0;) {
          global += (start[d] + rest % size[d]) * pitch;
          rest /= size[d];
          pitch *= e.shape[d];
        }
        uint64_t r = (name_hash ^ (static_cast<uint64_t>(global) * 0x9e3779b97f4a7c15ULL)) *
                     0xff51afd7ed558ccdULL;
        r ^= r >> 29;
        if (e.dtype == weightbeam::v1::DTYPE_BF16) {
          const uint16_t bits = static_cast<uint16_t>(
              ((r & 1) << 15) | ((119 + (r >> 1) % 16) << 7) | ((r >> 8) & 0x7f));
          b[i * 2] = static_cast<uint8_t>(bits);
          b[i * 2 + 1] = static_cast<uint8_t>(bits >> 8);
        } else {
          for (size_t k = 0; k < eb; ++k) b[i * eb + k] = static_cast<uint8_t>(r >> (8 * k));
        }
      }
    }
  }
  return out;
}

// Fresh destination buffers: every inference region of `agents`, 0xEE throughout.
inline Buffers FreshDestinations(const std::vector<AgentLayout>& agents) {
  Buffers dst;
  for (size_t a = 0; a < agents.size(); ++a) {
    for (size_t t = 0; t < agents[a].tensors.size(); ++t) {
      const TensorEntry& e = agents[a].tensors[t];
      if (e.owner.role == Role::kInference) {
        dst[{int64_t(a), int64_t(e.region)}].assign(e.region_bytes, 0xEE);
      }
    }
  }
  return dst;
}

// Applies one op reading `src` (its source tensor's bytes) to `dst`.
inline void ApplyOp(const std::vector<AgentLayout>& agents, const PlannedOp& op,
                    const std::vector<uint8_t>& src, Buffers* dst) {
  auto region = [&](int32_t tensor) {
    return std::pair<int64_t, int64_t>(op.dst_agent, agents[op.dst_agent].tensors[tensor].region);
  };
  std::vector<uint8_t>& out = dst->at(region(op.dst_tensor));
  const uint64_t se = DTypeBytes(op.SrcDType()), de = DTypeBytes(op.DstDType());
  REQUIRE(op.rows > 0);
  REQUIRE(op.src_offset + (op.rows - 1) * op.src_stride + op.row_elems * se <= src.size());
  REQUIRE(op.dst_offset + (op.rows - 1) * op.dst_stride + op.row_elems * de <= out.size());
  if (op.GetTransform() == weightbeam::v1::TRANSFORM_COPY) {
    for (uint64_t r = 0; r < op.rows; ++r) {
      std::memcpy(out.data() + op.dst_offset + r * op.dst_stride,
                  src.data() + op.src_offset + r * op.src_stride, op.row_elems * se);
    }
    return;
  }
  REQUIRE(op.GetTransform() == weightbeam::v1::TRANSFORM_FP8_BLOCK);
  REQUIRE(se == 2);
  std::vector<uint8_t>& scales = dst->at(region(op.scale_tensor));
  auto at = [&](uint64_t r, uint64_t c) {
    return Bf16ToFloat(src.data() + op.src_offset + r * op.src_stride + c * 2);
  };
  for (uint64_t br = 0; br < op.rows; br += 128) {
    for (uint64_t bc = 0; bc < op.row_elems; bc += 128) {
      const uint64_t re = std::min(op.rows, br + 128), ce = std::min(op.row_elems, bc + 128);
      float amax = 0;
      for (uint64_t r = br; r < re; ++r) {
        for (uint64_t c = bc; c < ce; ++c) amax = std::max(amax, std::fabs(at(r, c)));
      }
      const float scale = amax > 0 ? amax / 127.0f : 1.0f;
      for (uint64_t r = br; r < re; ++r) {
        for (uint64_t c = bc; c < ce; ++c) {
          out[op.dst_offset + r * op.dst_stride + c] =
              static_cast<uint8_t>(static_cast<int8_t>(std::lround(at(r, c) / scale)));
        }
      }
      const uint64_t s = op.scale_offset + (br / 128) * op.scale_stride + (bc / 128) * 4;
      REQUIRE(s + 4 <= scales.size());
      std::memcpy(scales.data() + s, &scale, 4);
    }
  }
}

// Applies every executed op of `plan` to fresh destination buffers (0xEE where nothing lands).
inline Buffers Apply(const std::vector<AgentLayout>& agents, const Plan& plan,
                     const Buffers& sources) {
  Buffers dst = FreshDestinations(agents);
  for (int32_t a : plan.agent_order) {
    ForEachExecutedOp(plan, a, [&](const PlannedOp& op) {
      ApplyOp(agents, op, sources.at({op.src_agent, op.src_tensor}), &dst);
    });
  }
  return dst;
}

}  // namespace wb::planner::testing
