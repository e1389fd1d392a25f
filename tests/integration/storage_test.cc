// The storage path end to end: two wb-agent processes with no controller and no network
// between them (tcp off) share only a directory. Two trainer ranks (FSDP row shards) publish
// versions of synthetic BF16 weights (N(0, 0.02), ~1% of elements change per version) through
// the publishing agent; two inference ranks with another sharding (column splits, uneven
// rows, replicated norms, an FP8 block-scaled tensor) see begin/commit from the subscribing agent
// and check every committed version bit for bit. A truncated and a corrupted file are refused with
// an abort naming the file, later deltas on the lost base are refused, and the next anchor
// recovers. Shared memory shrunk (ftruncate) under the publishing and the subscribing agent fails
// that version naming the tensor, never the agent.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <map>

#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "daemon/transform/transform.h"
#include "tests/demo/synthetic_weights.h"
#include "tests/support/process.h"

namespace v1 = weightbeam::v1;
using namespace wb::client;
using wb::testing::Process;

namespace {

struct Tensor {
  std::string name;
  int64_t rows, cols;  // cols 1: a 1-D tensor of `rows` elements
  std::vector<int64_t> shape() const {
    return cols == 1 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, cols};
  }
};
const std::vector<Tensor> kModel = {
    {"model.embed_tokens.weight", 512, 64},
    {"model.layers.0.self_attn.q_proj.weight", 256, 128},
    {"model.layers.0.mlp.down_proj.weight", 128, 384},
    {"model.norm.weight", 128, 1},
    {"model.layers.0.mlp.up_proj.weight", 256, 256},  // FP8 block-scaled on the inference side
};

bool IsFp8(const Tensor& t, v1::Role role) {
  return role == v1::ROLE_INFERENCE && t.name.find("up_proj") != std::string::npos;
}

// A shard: rows [r0, r0 + nr) x cols [c0, c0 + nc).
struct Cut {
  int64_t r0, nr, c0, nc;
};

// Trainers: rank k holds half the rows of everything. Inference: column halves of q_proj, an
// uneven column split of down_proj, an uneven row split of embed_tokens, norm replicated.
Cut TrainerCut(const Tensor& t, int rank) { return {rank * t.rows / 2, t.rows / 2, 0, t.cols}; }
Cut InferenceCut(const Tensor& t, int rank) {
  if (t.name.find("q_proj") != std::string::npos) return {0, t.rows, rank * 64, 64};
  if (t.name.find("down_proj") != std::string::npos) {
    return rank == 0 ? Cut{0, t.rows, 0, 100} : Cut{0, t.rows, 100, 284};
  }
  if (t.name.find("embed") != std::string::npos) {
    return rank == 0 ? Cut{0, 200, 0, t.cols} : Cut{200, 312, 0, t.cols};
  }
  if (t.name.find("up_proj") != std::string::npos) return {rank * 128, 128, 0, t.cols};
  return {0, t.rows, 0, 1};
}

TensorInfo Info(const Tensor& t, const Cut& c) {
  TensorInfo info{t.name, v1::DTYPE_BF16, t.shape(), {{c.r0, c.nr}}};
  if (t.cols > 1) info.shard.push_back({c.c0, c.nc});
  return info;
}

// Every tensor of one rank in one shared buffer, registered with its agent.
struct Side {
  SharedBuffer buffer;
  LocalSession session;
  std::vector<Cut> cuts;
  std::vector<uint64_t> offsets;
  uint16_t* data(size_t i) {
    return reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(buffer.data()) + offsets[i]);
  }
};

Side OpenSide(const std::string& socket, v1::Role role, int rank) {
  std::vector<Cut> cuts;
  std::vector<uint64_t> offsets;
  uint64_t bytes = 0;
  for (const auto& t : kModel) {
    cuts.push_back(role == v1::ROLE_TRAINER ? TrainerCut(t, rank) : InferenceCut(t, rank));
    offsets.push_back(bytes);
    bytes += cuts.back().nr * cuts.back().nc * (IsFp8(t, role) ? 1 : 2);
  }
  offsets.push_back(bytes);  // FP8 block scales (inference), one row of 2 per rank
  bytes += 2 * sizeof(float);
  auto buffer = SharedBuffer::Create(bytes, "storage");
  REQUIRE(buffer.ok());
  auto session = LocalSession::Connect(socket, Identity{role, rank, 0});
  REQUIRE(session.ok());
  for (size_t i = 0; i < kModel.size(); ++i) {
    const Cut& c = cuts[i];
    TensorInfo info = Info(kModel[i], c);
    const bool fp8 = IsFp8(kModel[i], role);
    if (fp8) info.dtype = v1::DTYPE_F8_E4M3;
    auto s = session->Register(info, *buffer, offsets[i], c.nr * c.nc * (fp8 ? 1 : 2));
    INFO(s.message());
    REQUIRE(s.ok());
    if (fp8) {
      TensorInfo scale{kModel[i].name + "_scale_inv", v1::DTYPE_F32, {2, 2}, {{rank, 1}, {0, 2}}};
      REQUIRE(session->Register(scale, *buffer, offsets.back(), 2 * sizeof(float)).ok());
    }
  }
  if (role == v1::ROLE_INFERENCE) REQUIRE(session->Watch().ok());
  return Side{std::move(*buffer), std::move(*session), cuts, offsets};
}

// The full tensors as the trainers hold them at each version, recomputed independently.
class Truth {
 public:
  Truth() {
    for (const auto& t : kModel) {
      auto& v = full_[t.name];
      v.resize(t.rows * t.cols);
      const uint64_t h = wb::demo::NameHash(t.name);
      for (uint64_t i = 0; i < v.size(); ++i) v[i] = wb::demo::BaseValue(h, i);
    }
  }
  void Advance(uint32_t version) {
    for (auto& [name, v] : full_) {
      wb::demo::ApplyVersion(wb::demo::NameHash(name), v.size(), version, 0, v.size(), v.data());
    }
  }
  // Copies the cut of tensor `i` out of the full tensor.
  std::vector<uint16_t> Slice(size_t i, const Cut& c) const {
    const Tensor& t = kModel[i];
    const auto& v = full_.at(t.name);
    std::vector<uint16_t> out;
    for (int64_t r = c.r0; r < c.r0 + c.nr; ++r) {
      for (int64_t k = c.c0; k < c.c0 + c.nc; ++k) out.push_back(v[r * t.cols + k]);
    }
    return out;
  }

 private:
  std::map<std::string, std::vector<uint16_t>> full_;
};

// The trainers' buffers at a version (their own shards only), as an optimizer would leave them.
void TrainStep(std::vector<Side>& trainers, uint32_t version) {
  for (auto& side : trainers) {
    for (size_t i = 0; i < kModel.size(); ++i) {
      const Tensor& t = kModel[i];
      const Cut& c = side.cuts[i];
      const uint64_t begin = c.r0 * t.cols, end = (c.r0 + c.nr) * t.cols;
      const uint64_t h = wb::demo::NameHash(t.name);
      uint16_t* p = side.data(i);
      if (version == 1) {
        for (uint64_t k = begin; k < end; ++k) p[k - begin] = wb::demo::BaseValue(h, k);
      }
      wb::demo::ApplyVersion(h, t.rows * t.cols, version, begin, end, p);
    }
  }
}

bool Verified(std::vector<Side>& inference, const Truth& truth) {
  for (auto& side : inference) {
    for (size_t i = 0; i < kModel.size(); ++i) {
      const std::vector<uint16_t> want = truth.Slice(i, side.cuts[i]);
      if (!IsFp8(kModel[i], v1::ROLE_INFERENCE)) {
        if (std::memcmp(want.data(), side.data(i), want.size() * 2) != 0) return false;
        continue;
      }
      // FP8: the BF16 values quantised in 128x128 blocks, with their float32 scales.
      wb::transform::TransformDesc desc;
      desc.kind = wb::transform::Kind::kFp8Block;
      desc.src_dtype = wb::transform::DType::kBF16;
      desc.dst_dtype = wb::transform::DType::kF8E4M3;
      desc.rows = side.cuts[i].nr;
      desc.cols = side.cuts[i].nc;
      std::vector<uint8_t> q(want.size());
      float scales[2] = {};
      REQUIRE(wb::transform::ValidateDesc(desc).ok());
      REQUIRE(wb::transform::ApplyTransformCpu(desc, want.data(), q.data(), scales).ok());
      if (std::memcmp(q.data(), side.data(i), q.size()) != 0) return false;
      if (std::memcmp(scales, side.data(kModel.size()), sizeof(scales)) != 0) return false;
    }
  }
  return true;
}

std::unique_ptr<Process> StartAgent(const std::string& dir, const std::string& name,
                                    const std::string& storage_yaml) {
  const std::string config = dir + "/" + name + ".yaml";
  std::ofstream(config) << "name: " << name << "\nlocal_socket: " << dir << "/" << name
                        << ".sock\nlisten: 127.0.0.1:" << wb::testing::FreePort()
                        << "\ncontroller: 127.0.0.1:" << wb::testing::FreePort()
                        << "\ntransports:\n  tcp:\n    enabled: false\nstorage:\n"
                        << storage_yaml;
  auto p = std::make_unique<Process>(
      std::vector<std::string>{wb::testing::Runfile("daemon/wb-agent"), "--config", config},
      dir + "/" + name + ".log");
  const std::string sock = dir + "/" + name + ".sock";
  REQUIRE(wb::testing::WaitUntil([&] { return access(sock.c_str(), F_OK) == 0; },
                                 std::chrono::seconds(15)));
  return p;
}

// The next event on every inference session; all must agree.
v1::Event NextEverywhere(std::vector<Side>& inference) {
  v1::Event first;
  for (size_t k = 0; k < inference.size(); ++k) {
    auto e = inference[k].session.NextEvent(std::chrono::seconds(20));
    INFO((e.ok() ? "" : std::string(e.status().message())));
    REQUIRE(e.ok());
    if (k == 0) first = *e;
    CHECK(e->kind() == first.kind());
    CHECK(e->version() == first.version());
  }
  return first;
}

void ExpectCommit(std::vector<Side>& inference, uint32_t version) {
  v1::Event begin = NextEverywhere(inference);
  INFO(begin.reason());
  CHECK(begin.kind() == v1::Event::KIND_BEGIN);
  CHECK(begin.version() == version);
  v1::Event commit = NextEverywhere(inference);
  CHECK(commit.kind() == v1::Event::KIND_COMMIT);
  CHECK(commit.version() == version);
}

std::string ExpectAbort(std::vector<Side>& inference, uint32_t version) {
  v1::Event abort = NextEverywhere(inference);
  CHECK(abort.kind() == v1::Event::KIND_ABORT);
  CHECK(abort.version() == version);
  return abort.reason();
}

}  // namespace

TEST_CASE(
    "versions travel through a shared directory only; bad files are refused; anchors "
    "recover") {
  const std::string dir = wb::testing::TempDir("wb-storage-");
  const std::string shared = dir + "/bucket";
  auto pub =
      StartAgent(dir, "train-site", "  dir: " + shared + "\n  role: publish\n  anchor_every: 4\n");
  auto sub =
      StartAgent(dir, "infer-site", "  dir: " + shared + "\n  role: subscribe\n  poll_ms: 50\n");
  std::vector<Side> inference;
  for (int r = 0; r < 2; ++r) {
    inference.push_back(OpenSide(dir + "/infer-site.sock", v1::ROLE_INFERENCE, r));
  }
  std::vector<Side> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(OpenSide(dir + "/train-site.sock", v1::ROLE_TRAINER, r));
  }
  Truth truth;
  uint64_t dense = 0;
  auto publish = [&](uint32_t v) {
    TrainStep(trainers, v);
    truth.Advance(v);
    auto r = trainers[0].session.Publish(v);
    INFO((r.ok() ? "" : std::string(r.status().message())));
    REQUIRE(r.ok());
    CHECK(r->version == v);
    return *r;
  };
  auto file_of = [&](uint32_t v, int rank) {
    char name[64];
    std::snprintf(name, sizeof(name), "/%020u.train-site.%d.safetensors", v, rank);
    return shared + name;
  };

  // Versions 1-3: an anchor, then deltas far smaller than the weights.
  for (uint32_t v = 1; v <= 3; ++v) {
    PublishReport r = publish(v);
    if (v == 1) {
      CHECK(r.anchor);
      dense = r.dense_bytes;
      CHECK(dense == (512 * 64 + 256 * 128 + 128 * 384 + 128 + 256 * 256) * 2);
      CHECK(r.bytes_written > dense);
    } else {
      CHECK_FALSE(r.anchor);
      CHECK(r.base_version == v - 1);
      CHECK(r.bytes_written * 10 < dense);
    }
    ExpectCommit(inference, v);
    CHECK(Verified(inference, truth));
  }

  // Version 4: one of its files arrives truncated. The subscriber is frozen meanwhile so it
  // cannot read the version before the damage is done.
  sub->Signal(SIGSTOP);
  publish(4);
  REQUIRE(truncate(file_of(4, 1).c_str(), 200) == 0);
  sub->Signal(SIGCONT);
  std::string why = ExpectAbort(inference, 4);
  CHECK_THAT(why, Catch::Contains("version 4 refused: " + file_of(4, 1) +
                                  ": 200 bytes, but the manifest says"));
  {  // the destinations still hold version 3
    Truth at3;
    for (uint32_t v = 1; v <= 3; ++v) at3.Advance(v);
    CHECK(Verified(inference, at3));
  }

  // Version 5 is an anchor (every 4 versions): the subscriber recovers.
  CHECK(publish(5).anchor);
  ExpectCommit(inference, 5);
  CHECK(Verified(inference, truth));

  // Version 6: a flipped byte. Versions 7 and 8 build on it and are refused too; 9 recovers.
  sub->Signal(SIGSTOP);
  publish(6);
  {
    std::fstream io(file_of(6, 0), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-2, std::ios::end);
    char c = 0;
    io.read(&c, 1);
    c ^= 0x01;
    io.seekp(-2, std::ios::end);
    io.write(&c, 1);
  }
  sub->Signal(SIGCONT);
  CHECK_THAT(ExpectAbort(inference, 6),
             Catch::Contains(file_of(6, 0) + ": checksum") && Catch::Contains("(corrupted)"));
  for (uint32_t v = 7; v <= 8; ++v) {
    CHECK_FALSE(publish(v).anchor);
    CHECK(ExpectAbort(inference, v) == "version " + std::to_string(v) +
                                           " refused: writer 'train-site' wrote a delta on "
                                           "version " +
                                           std::to_string(v - 1) +
                                           " but this agent holds version 5; waiting for "
                                           "the next anchor");
  }
  CHECK(publish(9).anchor);
  ExpectCommit(inference, 9);
  CHECK(Verified(inference, truth));
  for (uint32_t v = 10; v <= 11; ++v) {
    CHECK_FALSE(publish(v).anchor);
    ExpectCommit(inference, v);
    CHECK(Verified(inference, truth));
  }

  // Old versions are pruned (the previous anchor, 5, and what follows stay); versions must
  // increase; only a publishing agent publishes.
  CHECK(access(file_of(4, 0).c_str(), F_OK) != 0);
  CHECK(access(file_of(5, 0).c_str(), F_OK) == 0);
  auto stale = trainers[1].session.Publish(11);
  REQUIRE_FALSE(stale.ok());
  CHECK_THAT(std::string(stale.status().message()),
             Catch::Contains("version 11 is not newer than the last published version 11"));
  auto wrong_side =
      LocalSession::Connect(dir + "/infer-site.sock", Identity{v1::ROLE_TRAINER, 5, 0});
  REQUIRE(wrong_side.ok());
  auto refused = wrong_side->Publish(12);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("this agent subscribes to " + shared));
}

namespace {

// Resizes the shared-memory object behind `buffer` (as its owner may, at any time).
void ResizeObject(const SharedBuffer& buffer, uint64_t bytes) {
  const int fd = shm_open(buffer.shm_name().c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  close(fd);
}

}  // namespace

// The owners of registered memory shrink (ftruncate) their shared-memory objects: the
// publishing agent's reads and the subscribing agent's writes fail that version, naming the
// tensor and the cause, and both agents live on; once the objects have their size back, the
// next versions go through.
TEST_CASE("shared memory shrunk under the storage path fails a version, not the agent") {
  const std::string dir = wb::testing::TempDir("wb-storage-");
  const std::string shared = dir + "/bucket";
  auto pub =
      StartAgent(dir, "train-site", "  dir: " + shared + "\n  role: publish\n  anchor_every: 2\n");
  auto sub =
      StartAgent(dir, "infer-site", "  dir: " + shared + "\n  role: subscribe\n  poll_ms: 50\n");
  std::vector<Side> inference;
  for (int r = 0; r < 2; ++r) {
    inference.push_back(OpenSide(dir + "/infer-site.sock", v1::ROLE_INFERENCE, r));
  }
  std::vector<Side> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(OpenSide(dir + "/train-site.sock", v1::ROLE_TRAINER, r));
  }
  const uint64_t trainer_bytes = trainers[1].offsets.back() + 2 * sizeof(float);
  const uint64_t inference_bytes = inference[1].offsets.back() + 2 * sizeof(float);
  Truth truth;
  auto publish = [&](uint32_t v) {
    TrainStep(trainers, v);
    truth.Advance(v);
    auto r = trainers[0].session.Publish(v);
    INFO((r.ok() ? "" : std::string(r.status().message())));
    REQUIRE(r.ok());
    return *r;
  };
  CHECK(publish(1).anchor);
  ExpectCommit(inference, 1);
  CHECK(Verified(inference, truth));

  // The subscriber's writes: inference rank 1 keeps only its first tensor.
  ResizeObject(inference[1].buffer, inference[1].offsets[1]);
  CHECK_FALSE(publish(2).anchor);
  v1::Event begin = NextEverywhere(inference);
  CHECK(begin.kind() == v1::Event::KIND_BEGIN);
  CHECK_THAT(ExpectAbort(inference, 2),
             Catch::Contains("version 2 refused: destination tensor '") &&
                 Catch::Contains("(rank 1): its memory could not be") && Catch::Contains("SIGBUS"));
  CHECK(sub->running());
  ResizeObject(inference[1].buffer, inference_bytes);
  CHECK(publish(3).anchor);
  ExpectCommit(inference, 3);
  CHECK(Verified(inference, truth));

  // The publisher's reads: trainer rank 1 keeps only its first tensor.
  ResizeObject(trainers[1].buffer, trainers[1].offsets[1]);
  auto refused = trainers[0].session.Publish(4);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("publishing version 4") &&
                 Catch::Contains("(rank 1): its memory could not be read") &&
                 Catch::Contains("SIGBUS"));
  CHECK(pub->running());
  ResizeObject(trainers[1].buffer, trainer_bytes);
  for (uint32_t v = 1; v <= 3; ++v) TrainStep(trainers, v);  // its bytes, back from zero
  CHECK(publish(5).anchor);                                  // after a failed publish: an anchor
  ExpectCommit(inference, 5);
  CHECK(Verified(inference, truth));
}

TEST_CASE("storage path into a staged agent: versions land in staging and swap at commit") {
  const std::string dir = wb::testing::TempDir("wb-storage-staged-");
  const std::string shared = dir + "/bucket";
  auto pub =
      StartAgent(dir, "train-site", "  dir: " + shared + "\n  role: publish\n  anchor_every: 4\n");
  auto sub = StartAgent(
      dir, "infer-site",
      "  dir: " + shared + "\n  role: subscribe\n  poll_ms: 50\nreceive:\n  mode: staged\n");
  std::vector<Side> inference;
  for (int r = 0; r < 2; ++r) {
    inference.push_back(OpenSide(dir + "/infer-site.sock", v1::ROLE_INFERENCE, r));
  }
  std::vector<Side> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(OpenSide(dir + "/train-site.sock", v1::ROLE_TRAINER, r));
  }
  Truth truth;
  // An anchor, then deltas: each patches the staging mirrors, which hold what is live.
  for (uint32_t v = 1; v <= 3; ++v) {
    TrainStep(trainers, v);
    truth.Advance(v);
    auto r = trainers[0].session.Publish(v);
    INFO((r.ok() ? "" : std::string(r.status().message())));
    REQUIRE(r.ok());
    ExpectCommit(inference, v);
    CHECK(Verified(inference, truth));
  }
  std::ifstream log(dir + "/infer-site.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("version 3: swapped into the live tensors"));
}
