#include "tests/demo/role_support.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "config/config.h"
#include "daemon/transform/transform.h"
#include "tests/demo/synthetic_weights.h"

namespace wb::demo {

namespace v1 = weightbeam::v1;
using planner::TensorEntry;

uint64_t EntryElements(const TensorEntry& e) {
  uint64_t n = 1;
  if (e.shard.empty()) {
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
  } else {
    for (const auto& s : e.shard) n *= static_cast<uint64_t>(s.size);
  }
  return n;
}

uint64_t EntryBytes(const TensorEntry& e) {
  return EntryElements(e) * static_cast<uint64_t>(planner::DTypeBytes(e.dtype));
}

uint64_t Align64(uint64_t n) { return (n + 63) / 64 * 64; }

uint64_t Total(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Rect ShardRect(const TensorEntry& e) {
  if (e.shape.size() < 2) {
    const int64_t n = e.shape.empty() ? 1 : e.shape[0];
    if (e.shard.empty()) return {0, 1, 0, n, n};
    return {0, 1, e.shard[0].start, e.shard[0].size, n};
  }
  const int64_t cols = e.shape[1];
  if (e.shard.empty()) return {0, e.shape[0], 0, cols, cols};
  return {e.shard[0].start, e.shard[0].size, e.shard[1].start, e.shard[1].size, cols};
}

client::TensorInfo InfoOf(const TensorEntry& e) {
  client::TensorInfo t;
  t.name = e.name;
  t.dtype = e.dtype;
  t.global_shape = e.shape;
  for (const auto& s : e.shard) t.shard.emplace_back(s.start, s.size);
  return t;
}

absl::StatusOr<Registered> AllocateSizes(const std::vector<uint64_t>& sizes,
                                         const std::string& name) {
  uint64_t total = 0;
  std::vector<uint64_t> offsets;
  for (uint64_t size : sizes) {
    offsets.push_back(total);
    total += Align64(size);
  }
  auto buf = client::SharedBuffer::Create(std::max<uint64_t>(total, 64), name);
  if (!buf.ok()) return buf.status();
  return Registered{std::move(*buf), offsets};
}

absl::StatusOr<Registered> Allocate(const std::vector<TensorEntry>& entries,
                                    const std::string& name) {
  std::vector<uint64_t> sizes;
  for (const auto& e : entries) sizes.push_back(EntryBytes(e));
  return AllocateSizes(sizes, name);
}

bool StdinClosed() {
  pollfd p{0, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char c;
  return read(0, &c, 1) <= 0;  // the driver only closes our stdin, it sends nothing
}

std::string FirstMismatch(const std::string& name, const uint8_t* want, const uint8_t* got,
                          uint64_t bytes) {
  if (std::memcmp(want, got, bytes) == 0) return "";
  for (uint64_t i = 0; i < bytes; ++i) {
    if (want[i] != got[i]) {
      char buf[128];
      std::snprintf(buf, sizeof(buf), " at byte %llu: expected 0x%02x, found 0x%02x",
                    static_cast<unsigned long long>(i), want[i], got[i]);
      return name + buf;
    }
  }
  return "";
}

std::string CheckFp8Block(const std::string& name, const std::vector<uint16_t>& want, uint64_t rows,
                          uint64_t cols, const uint8_t* got, const std::string& scale_name,
                          uint64_t scale_bytes, const uint8_t* scale_got, uint64_t* checked) {
  const transform::TransformDesc d{transform::Kind::kFp8Block, transform::DType::kBF16,
                                   transform::DType::kF8E4M3, rows, cols};
  std::vector<uint8_t> fp8(rows * cols);
  std::vector<float> scales(transform::ScaleRows(d) * transform::ScaleCols(d));
  if (auto s = transform::ApplyTransformCpu(d, want.data(), fp8.data(), scales.data()); !s.ok()) {
    return std::string(s.message());
  }
  std::string mismatch = FirstMismatch(name, fp8.data(), got, fp8.size());
  *checked += fp8.size();
  if (!mismatch.empty() || scale_name.empty()) return mismatch;
  if (scale_bytes != scales.size() * 4) {
    mismatch = absl::StrCat(scale_name, ": ", scale_bytes, " bytes registered, ", scales.size() * 4,
                            " expected");
  } else {
    mismatch = FirstMismatch(scale_name, reinterpret_cast<const uint8_t*>(scales.data()), scale_got,
                             scales.size() * 4);
  }
  *checked += scales.size() * 4;
  return mismatch;
}

std::string CheckFp8(const TensorEntry& e, const std::vector<uint16_t>& want, uint64_t rows,
                     uint64_t cols, const uint8_t* got, const TensorEntry* scale,
                     const uint8_t* scale_got, uint64_t* checked) {
  return CheckFp8Block(e.name, want, rows, cols, got, scale ? scale->name.str() : std::string(),
                       scale ? EntryBytes(*scale) : 0, scale_got, checked);
}

absl::StatusOr<SyntheticModel> LayOut(planner::ModelSpec spec, planner::TrainerOptions trainer,
                                      planner::InferenceOptions inference) {
  trainer.nics_per_agent = 1;
  inference.nics_per_agent = 1;
  inference.fp8 = true;
  auto layouts = planner::BuildLayouts(spec, trainer, inference);
  if (!layouts.ok()) return layouts.status();
  return SyntheticModel{std::move(spec), std::move(*layouts)};
}

std::vector<TensorEntry> EntriesOf(const SyntheticModel& model, planner::Role role, int replica,
                                   int rank) {
  std::vector<TensorEntry> out;
  for (const auto& agent : model.layouts) {
    for (const auto& t : agent.tensors) {
      if (t.owner.role == role && t.owner.rank == rank && t.owner.replica == replica) {
        out.push_back(t);
      }
    }
  }
  return out;
}

std::optional<Side> OpenSide(const std::string& socket, const client::Identity& who,
                             const std::vector<TensorEntry>& entries,
                             const std::string& buffer_name, const std::string& log_name) {
  auto session = client::LocalSession::Connect(socket, who);
  if (!session.ok()) {
    std::fprintf(stderr, "%s: %s\n", log_name.c_str(),
                 std::string(session.status().message()).c_str());
    return std::nullopt;
  }
  auto reg = Allocate(entries, buffer_name);
  if (!reg.ok()) {
    std::fprintf(stderr, "%s: %s\n", log_name.c_str(), std::string(reg.status().message()).c_str());
    return std::nullopt;
  }
  return Side{std::move(*session), std::move(*reg)};
}

bool RegisterAll(Side& side, const std::vector<TensorEntry>& entries, const std::string& log_name) {
  std::vector<client::BufferSlice> batch;
  for (size_t i = 0; i < entries.size(); ++i) {
    batch.push_back({InfoOf(entries[i]), side.reg.offsets[i], EntryBytes(entries[i])});
    if (batch.size() == 1000 || i + 1 == entries.size()) {
      if (auto s = side.session.RegisterBatch(batch, side.reg.buffer); !s.ok()) {
        std::fprintf(stderr, "%s: %s\n", log_name.c_str(), std::string(s.message()).c_str());
        return false;
      }
      batch.clear();
    }
  }
  return true;
}

std::vector<std::string> FusionParts(const std::string& name) {
  std::vector<std::string> parts{name};
  for (const auto& rule : config::DefaultFusionRules()) {
    if (absl::EndsWith(name, rule.fused)) {
      const std::string prefix = name.substr(0, name.size() - rule.fused.size());
      parts.clear();
      for (const auto& p : rule.parts) parts.push_back(prefix + p);
    }
  }
  return parts;
}

void WriteF32(const uint16_t* bf16, uint64_t n, float* out) {
  for (uint64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(bf16[i]);
}

void ServeTrainerLines(const std::vector<TensorEntry>& entries,
                       const std::function<void(uint32_t version)>& perturb) {
  uint64_t bytes = 0;
  for (const auto& e : entries) bytes += EntryBytes(e);
  ServeTrainerLines(bytes, entries.size(), perturb);
}

void ServeTrainerLines(uint64_t bytes, size_t count,
                       const std::function<void(uint32_t version)>& perturb) {
  std::printf("ready %llu %zu\n", static_cast<unsigned long long>(bytes), count);
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint32_t version = 0;
    in >> cmd >> version;
    if (cmd != "perturb") continue;
    perturb(version);
    std::printf("ok %u\n", version);
    std::fflush(stdout);
  }
}

namespace {

// The first mismatch of the entries in `reg` against `expected` ("" when none).
std::string CheckEntries(const std::vector<TensorEntry>& entries, const Registered& reg,
                         const ExpectedValues& expected, uint64_t* checked) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < entries.size(); ++i) index[entries[i].name] = i;
  const auto* base = static_cast<const uint8_t*>(reg.buffer.data());
  std::string mismatch;
  for (size_t i = 0; i < entries.size() && mismatch.empty(); ++i) {
    const auto& e = entries[i];
    if (absl::EndsWith(e.name.str(), "_scale_inv")) continue;  // checked with its weight
    uint64_t rows = 0, cols = 0;
    std::vector<uint16_t> want = expected(e, &rows, &cols);
    const uint8_t* got = base + reg.offsets[i];
    if (e.dtype == v1::DTYPE_BF16) {
      mismatch =
          FirstMismatch(e.name, reinterpret_cast<const uint8_t*>(want.data()), got, EntryBytes(e));
      *checked += EntryBytes(e);
      continue;
    }
    if (e.dtype == v1::DTYPE_F32) {
      std::vector<float> f(want.size());
      WriteF32(want.data(), want.size(), f.data());
      mismatch =
          FirstMismatch(e.name, reinterpret_cast<const uint8_t*>(f.data()), got, EntryBytes(e));
      *checked += EntryBytes(e);
      continue;
    }
    auto sit = index.find(e.name.str() + "_scale_inv");
    const bool scaled = sit != index.end();
    mismatch = CheckFp8(e, want, rows, cols, got, scaled ? &entries[sit->second] : nullptr,
                        scaled ? base + reg.offsets[sit->second] : nullptr, checked);
  }
  return mismatch;
}

}  // namespace

int ServeInferenceChecks(client::LocalSession& session, const std::vector<TensorEntry>& entries,
                         const Registered& reg, const std::string& who, bool say_gone,
                         const std::function<absl::Status(uint32_t version)>& advance,
                         const ExpectedValues& expected) {
  uint64_t bytes = 0;
  for (const auto& e : entries) bytes += EntryBytes(e);
  return ServeCommitChecks(
      session, bytes, entries.size(), who, say_gone, advance,
      [&](uint64_t* checked) { return CheckEntries(entries, reg, expected, checked); });
}

int ServeCommitChecks(client::LocalSession& session, uint64_t bytes, size_t count,
                      const std::string& who, bool say_gone,
                      const std::function<absl::Status(uint32_t version)>& advance,
                      const CheckCommitted& check) {
  std::printf("ready %llu %zu\n", static_cast<unsigned long long>(bytes), count);
  std::fflush(stdout);
  while (!StdinClosed()) {
    auto event = session.NextEvent(std::chrono::milliseconds(200));
    if (!event.ok()) {
      if (event.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      const std::string why(event.status().message());
      std::fprintf(stderr, "%s: %s\n", who.c_str(), why.c_str());
      if (say_gone) {
        std::printf("gone %s\n", why.c_str());
        std::fflush(stdout);
      }
      return 1;
    }
    if (event->kind() == v1::Event::KIND_ABORT) {
      std::printf("aborted %llu %s\n", static_cast<unsigned long long>(event->version()),
                  event->reason().c_str());
      std::fflush(stdout);
      continue;
    }
    if (event->kind() != v1::Event::KIND_COMMIT) continue;
    const uint32_t version = static_cast<uint32_t>(event->version());
    const absl::Status advanced = advance(version);
    uint64_t checked = 0;
    const std::string mismatch = advanced.ok() ? check(&checked) : std::string(advanced.message());
    if (mismatch.empty()) {
      std::printf("verified %u PASS %llu\n", version, static_cast<unsigned long long>(checked));
    } else {
      std::printf("verified %u FAIL %s\n", version, mismatch.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace wb::demo
