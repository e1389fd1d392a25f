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

// Every trainer tensor that holds something, as views of its memory (a tensor with one part
// filling it registers densely).
absl::Status RegisterTrainerTensors(LocalSession& session,
                                    const std::map<std::string, TensorMemory>& given,
                                    const std::vector<engines::TrainerTensor>& tensors,
                                    const std::string& where) {
  std::map<std::string, const engines::TrainerTensor*> listed;
  for (const engines::TrainerTensor& t : tensors) listed[t.name] = &t;
  for (const auto& [name, memory] : given) {
    if (listed.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trainer tensor '", name, "' (", where,
          "): the layout does not list it (a layer of another stage or an expert of another EP "
          "rank?)"));
    }
  }
  std::vector<Registration> all;
  for (const engines::TrainerTensor& t : tensors) {
    if (t.parts.empty()) continue;
    const TensorMemory* memory = Find(given, t.name);
    if (auto s = CheckMemory("trainer tensor", t.name, memory, t.shape, t.dtype); !s.ok()) {
      return s;
    }
    const bool view = !engines::FillsTensor(t);  // else a plain shard of its HF tensor
    for (const engines::ParamPart& part : t.parts) {
      Registration r;
      r.tensor.name = part.source;
      r.tensor.dtype = t.dtype;
      r.tensor.global_shape = part.source_shape;
      for (const engines::DimSlice& b : part.box) r.tensor.shard.push_back({b.start, b.size});
      if (view) {
        r.tensor.view_shape = t.shape;
        r.tensor.view_offset = part.offset;
        r.tensor.view_buffer = t.name;
      }
      r.memory = *memory;
      all.push_back(std::move(r));
    }
  }
  return RegisterAll(session, all);
}

}  // namespace

absl::Status RegisterMegatronParams(LocalSession& session,
                                    const std::map<std::string, TensorMemory>& params,
                                    const engines::ModelConfig& config,
                                    const engines::MegatronOptions& options) {
  absl::StatusOr<std::vector<engines::TrainerTensor>> tensors =
      engines::MegatronLayout(config, options);
  if (!tensors.ok()) return tensors.status();
  return RegisterTrainerTensors(
      session, params, *tensors,
      absl::StrCat("megatron tp ", options.tp_rank, "/", options.tp, " pp ", options.pp_rank, "/",
                   options.pp, " ep ", options.ep_rank, "/", options.ep));
}

absl::Status RegisterDTensorParams(LocalSession& session,
                                   const std::map<std::string, TensorMemory>& shards,
                                   const engines::ModelConfig& config,
                                   const engines::DTensorOptions& options) {
  absl::StatusOr<std::vector<engines::TrainerTensor>> tensors =
      engines::DTensorLayout(config, options);
  if (!tensors.ok()) return tensors.status();
  return RegisterTrainerTensors(session, shards, *tensors, "dtensor");
}

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
                              int64_t align_rows, bool whole_small) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer rank ", rank, " is not in [0, world ", world, ")"));
  }
  std::vector<Registration> all;
  const std::vector<engines::SourceTensor> sources = engines::SourceTensors(config);
  const std::vector<int> first_ranks =
      engines::FsdpFirstRanks(sources, world, align_rows, whole_small);
  for (size_t i = 0; i < sources.size(); ++i) {
    const engines::SourceTensor& t = sources[i];
    engines::DimSlice rows =
        engines::FsdpRows(t.shape[0], world, rank, align_rows, first_ranks[i], whole_small);
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
