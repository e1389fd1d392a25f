#include "client/weightbeam/engines.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/planner/layout.h"

namespace wb::client {
namespace {

struct Registration {
  TensorInfo tensor;
  TensorMemory memory;
};

uint64_t Bytes(const std::vector<int64_t>& shape, weightbeam::v1::DType dtype) {
  uint64_t n = planner::DTypeBytes(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

absl::Status CheckMemory(const char* what, const std::string& name, const TensorMemory* memory,
                         const std::vector<int64_t>& shape, weightbeam::v1::DType dtype) {
  if (memory == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name, "': no memory given"));
  }
  if (memory->length != Bytes(shape, dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", name, "': ", memory->length, " bytes given, the config's ",
                     planner::FormatShape(shape), " ", planner::DTypeName(dtype), " needs ",
                     Bytes(shape, dtype)));
  }
  return absl::OkStatus();
}

// Registers in order; on a refusal withdraws what was registered before it.
absl::Status RegisterAll(LocalSession& session, const std::vector<Registration>& all) {
  std::vector<std::string> done;
  for (const Registration& r : all) {
    absl::Status s =
        r.memory.buffer != nullptr
            ? session.Register(r.tensor, *r.memory.buffer, r.memory.offset, r.memory.length)
            : session.RegisterCuda(r.tensor, r.memory.device_ptr, r.memory.length, r.memory.device);
    if (!s.ok()) {
      for (const std::string& name : done) (void)session.Unregister(name);
      return s;
    }
    done.push_back(r.tensor.name);
  }
  return absl::OkStatus();
}

const TensorMemory* Find(const std::map<std::string, TensorMemory>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

}  // namespace

absl::Status RegisterEngineParams(LocalSession& session,
                                  const std::map<std::string, TensorMemory>& params,
                                  const engines::ModelConfig& config,
                                  const engines::EngineOptions& options) {
  absl::StatusOr<std::vector<engines::EngineParam>> layout = engines::EngineLayout(config, options);
  if (!layout.ok()) return layout.status();
  std::vector<Registration> all;
  for (const engines::EngineParam& p : *layout) {
    const TensorMemory* memory = Find(params, p.name);
    if (auto s = CheckMemory("engine parameter", p.name, memory, p.shape, p.dtype); !s.ok()) {
      return s;
    }
    for (const engines::ParamPart& part : p.parts) {
      Registration r;
      r.tensor.name = part.source;
      r.tensor.dtype = p.dtype;
      r.tensor.global_shape = part.source_shape;
      for (const engines::DimSlice& b : part.box) r.tensor.shard.push_back({b.start, b.size});
      r.tensor.view_shape = p.shape;
      r.tensor.view_offset = part.offset;
      r.tensor.view_buffer = p.name;
      r.memory = *memory;
      all.push_back(std::move(r));
    }
  }
  return RegisterAll(session, all);
}

absl::Status RegisterHfShards(LocalSession& session,
                              const std::map<std::string, TensorMemory>& shards,
                              const engines::ModelConfig& config, int rank, int world,
                              int64_t align_rows) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer rank ", rank, " is not in [0, world ", world, ")"));
  }
  std::vector<Registration> all;
  const std::vector<engines::SourceTensor> sources = engines::SourceTensors(config);
  const std::vector<int> first_ranks = engines::FsdpFirstRanks(sources, world, align_rows);
  for (size_t i = 0; i < sources.size(); ++i) {
    const engines::SourceTensor& t = sources[i];
    engines::DimSlice rows = engines::FsdpRows(t.shape[0], world, rank, align_rows, first_ranks[i]);
    if (rows.size == 0) continue;
    std::vector<int64_t> shape = t.shape;
    shape[0] = rows.size;
    if (auto s = CheckMemory("source tensor", t.name, Find(shards, t.name), shape, t.dtype);
        !s.ok()) {
      return s;
    }
    Registration r;
    r.tensor.name = t.name;
    r.tensor.dtype = t.dtype;
    r.tensor.global_shape = t.shape;
    r.tensor.shard.push_back({rows.start, rows.size});
    for (size_t d = 1; d < t.shape.size(); ++d) r.tensor.shard.push_back({0, t.shape[d]});
    r.memory = *Find(shards, t.name);
    all.push_back(std::move(r));
  }
  return RegisterAll(session, all);
}

}  // namespace wb::client
