#include "tests/demo/demo_roles.h"

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/weightbeam/engines.h"
#include "client/weightbeam/local_session.h"
#include "common/engines/engine_layout.h"
#include "tests/demo/expected_layout.h"
#include "tests/demo/gpu_buffers.h"
#include "tests/demo/role_support.h"
#include "tests/demo/synthetic_weights.h"

namespace wb::demo {

namespace v1 = weightbeam::v1;

namespace {

constexpr int64_t kBlock = 128;  // FP8 scale blocks are 128 x 128

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Said on stderr (the process's log) and as a line to the driver, which shows it.
int Fail(const std::string& who, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", who.c_str(), std::string(s.message()).c_str());
  std::printf("error %s: %s\n", who.c_str(), std::string(s.message()).c_str());
  std::fflush(stdout);
  return 1;
}

// One shared-memory buffer of `sizes` (and, with --gpu, a device copy of it), handed to the
// engines API as one TensorMemory per name. Held by pointer: the device copy points at `host`.
struct Memory {
  explicit Memory(Registered h) : host(std::move(h)) {}
  Registered host;
  absl::StatusOr<DeviceCopy> device = absl::FailedPreconditionError("not --gpu");
  std::map<std::string, client::TensorMemory> by_name;
  std::map<std::string, size_t> index;  // name -> its buffer in `sizes` order
};

absl::StatusOr<std::unique_ptr<Memory>> MakeMemory(const std::vector<std::string>& names,
                                                   const std::vector<uint64_t>& sizes, bool gpu) {
  auto host = AllocateSizes(sizes, "demo");
  if (!host.ok()) return host.status();
  auto m = std::make_unique<Memory>(std::move(*host));
  if (gpu) {
    m->device = DeviceCopy::Create(m->host);
    if (!m->device.ok()) return m->device.status();
  }
  for (size_t i = 0; i < names.size(); ++i) {
    client::TensorMemory t;
    if (gpu) {
      t.device_ptr = m->device->data() + m->host.offsets[i];
    } else {
      t.buffer = &m->host.buffer;
      t.offset = m->host.offsets[i];
    }
    t.length = sizes[i];
    m->by_name[names[i]] = t;
    m->index[names[i]] = i;
  }
  return m;
}

uint64_t Sum(const std::vector<uint64_t>& v) {
  uint64_t n = 0;
  for (uint64_t x : v) n += x;
  return n;
}

}  // namespace

int RunTrainer(const DemoShape& shape, int rank, const std::string& socket, bool gpu) {
  const std::string who = absl::StrCat("trainer ", rank);
  auto config = DemoConfig(shape);
  if (!config.ok()) return Fail(who, config.status());
  // This rank's torch.chunk rows of every HF tensor: one contiguous run of elements each.
  struct Held {
    std::string name;
    uint64_t begin, count, total;
  };
  std::vector<Held> held;
  std::vector<std::string> names;
  std::vector<uint64_t> sizes;
  for (const HfTensor& t : Qwen3HfTensors(DemoQwen3(shape))) {
    const Matrix2d m = As2d(t.shape);
    const Rows rows = TorchChunk(t.shape[0], shape.trainers, rank);
    if (rows.size == 0) continue;
    const uint64_t per_row = t.shape.size() == 1 ? 1 : static_cast<uint64_t>(m.cols);
    held.push_back({t.name, rows.start * per_row, rows.size * per_row,
                    static_cast<uint64_t>(m.rows * m.cols)});
    names.push_back(t.name);
    sizes.push_back(held.back().count * 2);
  }
  auto session = client::LocalSession::Connect(socket, {v1::ROLE_TRAINER, rank, 0});
  if (!session.ok()) return Fail(who, session.status());
  auto memory = MakeMemory(names, sizes, gpu);
  if (!memory.ok()) return Fail(who, memory.status());
  Memory& mem = **memory;
  auto* base = static_cast<uint8_t*>(mem.host.buffer.data());
  auto values = [&](size_t i) { return reinterpret_cast<uint16_t*>(base + mem.host.offsets[i]); };
  for (size_t i = 0; i < held.size(); ++i) {
    const uint64_t h = NameHash(held[i].name);
    for (uint64_t k = 0; k < held[i].count; ++k) values(i)[k] = BaseValue(h, held[i].begin + k);
  }
  if (gpu) {
    if (auto s = mem.device->Upload(); !s.ok()) return Fail(who, s);
  }
  if (auto s = client::RegisterHfShards(*session, mem.by_name, *config, rank, shape.trainers,
                                        /*align_rows=*/1);
      !s.ok()) {
    return Fail(who, s);
  }
  absl::Status upload = absl::OkStatus();
  ServeTrainerLines(Sum(sizes), held.size(), [&](uint32_t version) {
    for (size_t i = 0; i < held.size(); ++i) {
      const Held& t = held[i];
      ApplyVersion(NameHash(t.name), t.total, version, t.begin, t.begin + t.count, values(i));
    }
    if (gpu && upload.ok()) upload = mem.device->Upload();
  });
  return upload.ok() ? 0 : Fail(who, upload);
}

namespace {

// The inference worker's own copy of every HF tensor it needs, whole, at the latest version.
class Mirror {
 public:
  explicit Mirror(const std::vector<HfTensor>& tensors) {
    for (const HfTensor& t : tensors) shapes_[t.name] = As2d(t.shape);
  }
  const std::vector<uint16_t>& Get(const std::string& name) {
    auto it = values_.find(name);
    if (it != values_.end()) return it->second;
    auto& v = values_[name];
    const Matrix2d m = shapes_.at(name);
    const uint64_t total = static_cast<uint64_t>(m.rows * m.cols), h = NameHash(name);
    v.resize(total);
    for (uint64_t i = 0; i < total; ++i) v[i] = BaseValue(h, i);
    for (uint32_t u = 1; u <= version_; ++u) ApplyVersion(h, total, u, 0, total, v.data());
    return v;
  }
  void Advance(uint32_t version) {
    for (; version_ < version;) {
      ++version_;
      for (auto& [name, v] : values_) {
        ApplyVersion(NameHash(name), v.size(), version_, 0, v.size(), v.data());
      }
    }
  }
  Matrix2d Shape(const std::string& name) const { return shapes_.at(name); }

 private:
  std::map<std::string, Matrix2d> shapes_;
  std::map<std::string, std::vector<uint16_t>> values_;
  uint32_t version_ = 0;
};

}  // namespace

int RunInference(const DemoShape& shape, int rank, const std::string& socket, bool gpu) {
  const std::string who = absl::StrCat("inference ", rank);
  auto config = DemoConfig(shape);
  if (!config.ok()) return Fail(who, config.status());
  const Qwen3Shape dims = DemoQwen3(shape);
  const bool fp8 = !config->weight_block_size.empty();
  // The parameters vLLM holds on this rank, as expected_layout.h writes them down: their memory
  // is what the engine layouts must fill.
  const std::vector<ExpectedParam> params = VllmQwen3Rank(dims, shape.tp, rank, fp8);
  if (params.empty()) {
    return Fail(who, absl::InvalidArgumentError(
                         absl::StrCat("tp ", shape.tp,
                                      " does not split Qwen3-0.6B's heads, kv heads, "
                                      "intermediate size or padded vocab evenly")));
  }
  std::vector<std::string> names;
  std::vector<uint64_t> sizes;
  for (const ExpectedParam& p : params) {
    const Matrix2d m = As2d(p.shape);
    names.push_back(p.name);
    sizes.push_back(static_cast<uint64_t>(m.rows * m.cols) * (p.fp8 ? 1 : 2));
    if (p.fp8) {
      names.push_back(p.name + "_scale_inv");
      sizes.push_back(static_cast<uint64_t>(CeilDiv(m.rows, kBlock) * CeilDiv(m.cols, kBlock)) * 4);
    }
  }
  auto session = client::LocalSession::Connect(socket, {v1::ROLE_INFERENCE, rank, 0});
  if (!session.ok()) return Fail(who, session.status());
  auto memory = MakeMemory(names, sizes, gpu);
  if (!memory.ok()) return Fail(who, memory.status());
  Memory& mem = **memory;
  if (gpu) {
    // Zero, as the engine's loader leaves vocabulary padding (weightbeam never writes it).
    if (auto s = mem.device->Upload(); !s.ok()) return Fail(who, s);
  }
  engines::EngineOptions options;
  options.engine = engines::Engine::kVllm;
  options.tp = shape.tp;
  options.tp_rank = rank;
  options.fp8 = fp8;
  if (auto s = client::RegisterEngineParams(*session, mem.by_name, *config, options); !s.ok()) {
    return Fail(who, s);
  }
  if (auto s = session->Watch(); !s.ok()) return Fail(who, s);
  Mirror mirror(Qwen3HfTensors(dims));
  const auto* base = static_cast<const uint8_t*>(mem.host.buffer.data());
  auto check = [&](uint64_t* checked) -> std::string {
    std::string mismatch;
    for (const ExpectedParam& p : params) {
      const std::vector<uint16_t> want = Assemble(
          p, [&](const std::string& n) -> const std::vector<uint16_t>& { return mirror.Get(n); },
          [&](const std::string& n) { return mirror.Shape(n); });
      // The host buffer: with --gpu, the device buffer copied back (same offsets).
      const uint8_t* at = base + mem.host.offsets[mem.index.at(p.name)];
      if (p.fp8) {
        const Matrix2d m = As2d(p.shape);
        const std::string scale = p.name + "_scale_inv";
        const size_t s = mem.index.at(scale);
        mismatch = CheckFp8Block(p.name, want, m.rows, m.cols, at, scale, sizes[s],
                                 base + mem.host.offsets[s], checked);
      } else {
        mismatch = FirstMismatch(p.name, reinterpret_cast<const uint8_t*>(want.data()), at,
                                 want.size() * 2);
        *checked += want.size() * 2;
      }
      if (!mismatch.empty()) break;
    }
    return mismatch;
  };
  return ServeCommitChecks(
      *session, Sum(sizes), names.size(), who, /*say_gone=*/false,
      [&](uint32_t version) -> absl::Status {
        mirror.Advance(version);
        // With --gpu the destination bytes are checked on the host: the device buffer copied back.
        if (!gpu) return absl::OkStatus();
        absl::Status s = mem.device->Download();
        if (!s.ok())
          return absl::Status(s.code(),
                              absl::StrCat("copying the device buffer back: ", s.message()));
        return s;
      },
      check);
}

}  // namespace wb::demo
