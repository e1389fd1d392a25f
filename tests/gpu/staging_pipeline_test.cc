// The staging pipeline without a GPU: a fake copy engine whose copies only happen when waited
// for (as on a stream), so the tests see that chunk i + 1 is in flight while chunk i is
// consumed, that bytes arrive intact at every size, and that a failure anywhere stops the
// transfer and drains the engine.
#include "daemon/gpu/staging_pipeline.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace wb::gpu {
namespace {

class FakeEngine : public CopyEngine {
 public:
  explicit FakeEngine(StagingOptions o) : options_(o), buffers_(o.depth) {
    for (auto& b : buffers_) b.resize(o.chunk_bytes);
  }
  const StagingOptions& options() const override { return options_; }
  uint8_t* buffer(int index) override { return buffers_[index].data(); }
  absl::Status EnqueueToHost(int buffer, const uint8_t* src, uint64_t bytes) override {
    log.push_back(absl::StrCat("d2h b", buffer, " ", bytes));
    if (fail_enqueue-- == 0) return absl::InternalError("injected copy failure");
    pending_.push_back({buffers_[buffer].data(), src, bytes, buffer});
    return absl::OkStatus();
  }
  absl::Status EnqueueToDevice(uint8_t* dst, int buffer, uint64_t bytes) override {
    log.push_back(absl::StrCat("h2d b", buffer, " ", bytes));
    if (fail_enqueue-- == 0) return absl::InternalError("injected copy failure");
    pending_.push_back({dst, buffers_[buffer].data(), bytes, buffer});
    return absl::OkStatus();
  }
  absl::Status WaitBuffer(int buffer) override {
    log.push_back(absl::StrCat("wait b", buffer));
    // In stream order, up to and including the last copy through `buffer`.
    int last = -1;
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i].buffer == buffer) last = static_cast<int>(i);
    }
    for (int i = 0; i <= last; ++i) Run();
    return absl::OkStatus();
  }
  absl::Status WaitAll() override {
    log.push_back("wait all");
    while (!pending_.empty()) Run();
    return absl::OkStatus();
  }

  std::vector<std::string> log;
  int fail_enqueue = -1;  // fail the n-th enqueue (0-based); -1 never

 private:
  struct Copy {
    uint8_t* dst;
    const uint8_t* src;
    uint64_t bytes;
    int buffer;
  };
  void Run() {
    std::memcpy(pending_.front().dst, pending_.front().src, pending_.front().bytes);
    pending_.pop_front();
  }
  StagingOptions options_;
  std::vector<std::vector<uint8_t>> buffers_;
  std::deque<Copy> pending_;
};

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 9));
  return v;
}

size_t IndexOf(const std::vector<std::string>& log, const std::string& entry, size_t from = 0) {
  for (size_t i = from; i < log.size(); ++i) {
    if (log[i] == entry) return i;
  }
  return log.size();
}

TEST_CASE("staging options are checked with the accepted range in the message", "[staging]") {
  CHECK(ValidateStagingOptions({}).ok());
  auto bad_chunk = ValidateStagingOptions({1000, 2});
  CHECK(absl::IsInvalidArgument(bad_chunk));
  CHECK_THAT(std::string(bad_chunk.message()), Catch::Contains("chunk_bytes 1000"));
  CHECK(absl::IsInvalidArgument(ValidateStagingOptions({uint64_t{2} << 30, 2})));
  auto bad_depth = ValidateStagingOptions({4096, 1});
  CHECK_THAT(std::string(bad_depth.message()), Catch::Contains("depth 1"));
  CHECK(absl::IsInvalidArgument(ValidateStagingOptions({4096, 9})));
}

TEST_CASE("a transfer is cut into chunk_bytes pieces that rotate through the ring", "[staging]") {
  const StagingOptions o{4096, 3};
  CHECK(StagedChunkCount(0, o) == 0);
  CHECK(StagedChunkCount(1, o) == 1);
  CHECK(StagedChunkCount(4096, o) == 1);
  CHECK(StagedChunkCount(4097, o) == 2);
  CHECK(StagedChunkCount(uint64_t{10} << 30, {4 << 20, 2}) == 2560);
  const uint64_t length = 4096 * 4 + 100;
  uint64_t covered = 0;
  for (uint64_t i = 0; i < StagedChunkCount(length, o); ++i) {
    const StagedChunk c = StagedChunkAt(i, length, o);
    CHECK(c.offset == covered);
    CHECK(c.buffer == static_cast<int>(i % 3));
    covered += c.bytes;
  }
  CHECK(covered == length);
  CHECK(StagedChunkAt(4, length, o).bytes == 100);
}

TEST_CASE("device -> host: the next copy is in flight while a chunk is consumed", "[staging]") {
  FakeEngine engine({4096, 2});
  const auto src = Bytes(4096 * 3 + 10, 1);
  std::vector<uint8_t> got;
  auto st = StageFromDevice(engine, src.data(), src.size(),
                            [&](const uint8_t* data, uint64_t offset, uint64_t bytes) {
                              CHECK(offset == got.size());
                              engine.log.push_back(absl::StrCat("sink ", offset));
                              got.insert(got.end(), data, data + bytes);
                              return absl::OkStatus();
                            });
  REQUIRE(st.ok());
  CHECK(got == src);
  // Both buffers are filling before chunk 0 is handed over, and chunk 2's copy (into buffer 0)
  // is enqueued right after chunk 0 is consumed, before chunk 1 is.
  CHECK(IndexOf(engine.log, "d2h b1 4096") < IndexOf(engine.log, "sink 0"));
  const size_t sink0 = IndexOf(engine.log, "sink 0");
  CHECK(IndexOf(engine.log, "d2h b0 4096", sink0) < IndexOf(engine.log, "sink 4096"));
  CHECK(engine.log.back() == "wait all");
}

TEST_CASE("host -> device: a chunk is filled while the previous one is copied", "[staging]") {
  for (int depth : {2, 3, 8}) {
    for (uint64_t length : {uint64_t{1}, uint64_t{4096}, uint64_t{4096 * 5 + 7}}) {
      INFO("depth " << depth << ", length " << length);
      FakeEngine engine({4096, depth});
      const auto src = Bytes(length, 7);
      std::vector<uint8_t> dst(length, 0);
      auto st = StageToDevice(engine, dst.data(), length,
                              [&](uint8_t* data, uint64_t offset, uint64_t bytes) {
                                std::memcpy(data, src.data() + offset, bytes);
                                return absl::OkStatus();
                              });
      REQUIRE(st.ok());
      CHECK(dst == src);
      // A buffer is only refilled after the copy that last used it was waited for.
      const size_t chunks = StagedChunkCount(length, {4096, depth});
      CHECK(static_cast<size_t>(
                std::count_if(engine.log.begin(), engine.log.end(), [](const std::string& e) {
                  return e.rfind("wait b", 0) == 0;
                })) == (chunks > static_cast<size_t>(depth) ? chunks - depth : 0));
    }
  }
}

TEST_CASE("an empty transfer enqueues nothing and calls nobody", "[staging]") {
  FakeEngine engine({4096, 2});
  bool called = false;
  CHECK(StageFromDevice(engine, nullptr, 0, [&](const uint8_t*, uint64_t, uint64_t) {
          called = true;
          return absl::OkStatus();
        }).ok());
  CHECK(!called);
  CHECK(engine.log == std::vector<std::string>{"wait all"});
}

TEST_CASE("a failing sink stops the transfer and drains the copies in flight", "[staging]") {
  FakeEngine engine({4096, 2});
  const auto src = Bytes(4096 * 6, 3);
  int sinks = 0;
  auto st =
      StageFromDevice(engine, src.data(), src.size(), [&](const uint8_t*, uint64_t, uint64_t) {
        return ++sinks == 2 ? absl::UnavailableError("connection closed by the peer")
                            : absl::OkStatus();
      });
  CHECK(absl::IsUnavailable(st));
  CHECK(st.message() == "connection closed by the peer");
  CHECK(sinks == 2);
  CHECK(engine.log.back() == "wait all");
}

TEST_CASE("a failing copy stops the transfer with the copy's error", "[staging]") {
  for (int fail_at : {0, 1, 3}) {
    INFO("fail at enqueue " << fail_at);
    FakeEngine engine({4096, 2});
    engine.fail_enqueue = fail_at;
    std::vector<uint8_t> dst(4096 * 5);
    int sources = 0;
    auto st = StageToDevice(engine, dst.data(), dst.size(), [&](uint8_t*, uint64_t, uint64_t) {
      ++sources;
      return absl::OkStatus();
    });
    CHECK(absl::IsInternal(st));
    CHECK(st.message() == "injected copy failure");
    CHECK(sources == fail_at + 1);
    CHECK(engine.log.back() == "wait all");
  }
}

}  // namespace
}  // namespace wb::gpu
