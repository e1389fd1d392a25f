// Builds small hand-written layouts for planner tests: tensors added per agent with an owner,
// a shard given as {start, size} per dimension, and regions numbered per agent.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/planner/layout.h"
#include "common/planner/plan.h"

namespace wb::planner::testing {

using weightbeam::v1::DTYPE_BF16;
using weightbeam::v1::DTYPE_F16;
using weightbeam::v1::DTYPE_F32;
using weightbeam::v1::DTYPE_F8_E4M3;
using weightbeam::v1::DTYPE_I32;

class LayoutBuilder {
 public:
  // A trainer (source) tensor of `rank` (data-parallel `replica`) on `agent`, on GPU `gpu`.
  LayoutBuilder& Src(const std::string& agent, int rank, const std::string& name,
                     std::vector<int64_t> shape, std::vector<DimSlice> shard = {},
                     DType dtype = DTYPE_BF16, int replica = 0, int gpu = 0) {
    return Add(agent, Owner{Role::kTrainer, rank, replica}, name, std::move(shape),
               std::move(shard), dtype, gpu);
  }
  // An inference (destination) tensor of rank `rank` of replica `replica` on `agent`.
  LayoutBuilder& Dst(const std::string& agent, int replica, int rank, const std::string& name,
                     std::vector<int64_t> shape, std::vector<DimSlice> shard = {},
                     DType dtype = DTYPE_BF16, int gpu = 0) {
    return Add(agent, Owner{Role::kInference, rank, replica}, name, std::move(shape),
               std::move(shard), dtype, gpu);
  }
  // An FP8 (e4m3) 2-D destination and its f32 `name`_scale_inv: one scale per 128x128 block,
  // the scale shard covering the blocks the weight shard touches.
  LayoutBuilder& Fp8Dst(const std::string& agent, int replica, int rank, const std::string& name,
                        std::vector<int64_t> shape, std::vector<DimSlice> shard = {}, int gpu = 0) {
    auto blocks = [](int64_t n) { return (n + 127) / 128; };
    std::vector<int64_t> scale_shape;
    std::vector<DimSlice> scale_shard;
    for (size_t d = 0; d < shape.size(); ++d) {
      scale_shape.push_back(blocks(shape[d]));
      if (shard.empty()) continue;
      const int64_t first = shard[d].start / 128;
      scale_shard.push_back(DimSlice{first, blocks(shard[d].start + shard[d].size) - first});
    }
    Dst(agent, replica, rank, name, std::move(shape), std::move(shard), DTYPE_F8_E4M3, gpu);
    return Dst(agent, replica, rank, name + "_scale_inv", std::move(scale_shape),
               std::move(scale_shard), DTYPE_F32, gpu);
  }
  LayoutBuilder& Nics(const std::string& agent, int nics, double gbps = 50) {
    AgentLayout& a = Agent(agent);
    a.nics.clear();
    for (int i = 0; i < nics; ++i) a.nics.push_back(Nic{"mlx5_" + std::to_string(i), gbps});
    return *this;
  }
  // Makes the tensor last added on `agent` a part of buffer `buffer` (an engine parameter) of
  // `shape`, its element [0..0] at `offset`; its region holds the whole buffer.
  LayoutBuilder& View(const std::string& agent, std::vector<int64_t> shape,
                      std::vector<int64_t> offset, const std::string& buffer) {
    TensorEntry& t = Agent(agent).tensors.back();
    int64_t elems = 1;
    for (int64_t d : shape) elems *= d;
    t.view = BufferView{std::move(shape), std::move(offset), buffer};
    t.region_bytes = elems * DTypeBytes(t.dtype);
    return *this;
  }
  std::vector<AgentLayout> Build() const { return agents_; }

 private:
  AgentLayout& Agent(const std::string& name) {
    auto [it, inserted] = index_.try_emplace(name, agents_.size());
    if (inserted) {
      agents_.push_back(AgentLayout{name, {Nic{"mlx5_0", 50}}, {}});
    }
    return agents_[it->second];
  }
  LayoutBuilder& Add(const std::string& agent, Owner owner, const std::string& name,
                     std::vector<int64_t> shape, std::vector<DimSlice> shard, DType dtype,
                     int gpu) {
    AgentLayout& a = Agent(agent);
    TensorEntry t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.shard = std::move(shard);
    t.owner = owner;
    t.region = a.tensors.size() + 1;
    int64_t elems = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      elems *= t.shard.empty() ? t.shape[d] : t.shard[d].size;
    }
    t.region_bytes = elems * DTypeBytes(dtype);
    t.gpu = gpu;
    a.tensors.push_back(std::move(t));
    return *this;
  }

  std::vector<AgentLayout> agents_;
  std::map<std::string, size_t> index_;
};

// All executed ops of a plan (fan-out ops once per destination) with their sending agent's
// name, in the plan's order (agents by name).
inline std::vector<std::pair<std::string, PlannedOp>> AllOps(const std::vector<AgentLayout>& agents,
                                                             const Plan& plan) {
  std::vector<std::pair<std::string, PlannedOp>> out;
  for (int32_t a : plan.agent_order) {
    ForEachExecutedOp(plan, a, [&](const PlannedOp& op) { out.emplace_back(agents[a].name, op); });
  }
  return out;
}

}  // namespace wb::planner::testing
