// The transport suite, in one process: every case runs against the backend named by
// $WB_TEST_TRANSPORT (tcp, local, rdma). Remote-only cases live in transport_remote_test.cc.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/transport/factory.h"
#include "tests/transport/suite_util.h"

namespace wb::transport::testing {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kWait{20000};

bool Same(const uint8_t* a, const uint8_t* b, size_t n) { return std::memcmp(a, b, n) == 0; }

// A pair whose sender holds a source region of `src_size` bytes (pattern `seed`) and whose
// receiver holds a destination region of `dst_size` bytes (pattern `seed + 1`), which the peer
// knows.
struct Linked {
  std::unique_ptr<Pair> pair;
  std::unique_ptr<Buffer> src, dst;
};
Linked Link(size_t src_size, size_t dst_size, uint32_t seed) {
  Linked l{MakePair(), nullptr, nullptr};
  l.src = RegisterBuffer(l.pair->sender, src_size, Access::kSource, seed);
  l.dst = RegisterBuffer(l.pair->receiver, dst_size, Access::kDestination, seed + 1);
  REQUIRE(l.pair->peer->AddRemoteRegion(l.dst->desc).ok());
  return l;
}

TEST_CASE("a small write lands at the destination", "[transport]") {
  auto [pair, src, dst] = Link(4096, 4096, 1);
  const auto before = dst->bytes;

  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 100, dst->desc.region_id(), 200, 64}}, kWait);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(Same(dst->bytes.data() + 200, src->bytes.data() + 100, 64));
  CHECK(Same(dst->bytes.data(), before.data(), 200));
  CHECK(Same(dst->bytes.data() + 264, before.data() + 264, 4096 - 264));
}

TEST_CASE("a write of several MB lands intact", "[transport]") {
  const size_t size = 12 << 20;  // more than one frame and one share per connection
  auto [pair, src, dst] = Link(size, size, 3);

  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, size}}, kWait);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(dst->bytes == src->bytes);
}

TEST_CASE("many writes in one batch land at their offsets", "[transport]") {
  const size_t size = 2 << 20;
  auto [pair, src, dst] = Link(size, size, 5);

  // 1000 writes of varied lengths, scattered, leaving gaps that must stay untouched.
  std::vector<uint8_t> expected = dst->bytes;
  std::vector<WriteOp> ops;
  uint64_t dst_offset = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t length = 1 + (i * 37) % 1500;
    const uint64_t src_offset = (i * 7919) % (size - length);
    ops.push_back(
        WriteOp{src->desc.region_id(), src_offset, dst->desc.region_id(), dst_offset, length});
    std::memcpy(expected.data() + dst_offset, src->bytes.data() + src_offset, length);
    dst_offset += length + 13;  // gap
  }
  REQUIRE(dst_offset < size);

  absl::Status st = pair->peer->WriteBatch(ops, kWait);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(dst->bytes == expected);
}

// A column shard of a row-major source (o_proj / down_proj under TP): short rows far apart in
// the source, back to back at the destination. tcp sends such runs as one frame gathered from
// the source (more rows than one sendmsg's iovecs, more bytes than one 1 MiB frame here);
// long rows, gaps and rows out of order in the source go one by one, in the same batch.
TEST_CASE("rows of a strided source landing back to back arrive at their places", "[transport]") {
  const size_t size = 8 << 20;
  auto [pair, src, dst] = Link(size, size, 11);
  std::vector<uint8_t> expected = dst->bytes;
  std::vector<WriteOp> ops;
  uint64_t at = 0;
  auto add = [&](uint64_t src_offset, uint64_t length, uint64_t dst_offset) {
    ops.push_back(
        WriteOp{src->desc.region_id(), src_offset, dst->desc.region_id(), dst_offset, length});
    std::memcpy(expected.data() + dst_offset, src->bytes.data() + src_offset, length);
    at = dst_offset + length;
  };
  for (uint64_t r = 0; r < 1200; ++r) add(r * 4096, 2048, at);            // 2.3 MiB in 2 KiB rows
  add(5 << 20, 100 << 10, at);                                            // a long row, right after
  for (uint64_t r = 0; r < 50; ++r) add(r * 1000 + 7, 700, at + 5);       // gaps
  for (uint64_t r = 50; r > 0; --r) add((6 << 20) + r * 3000, 3000, at);  // source backwards
  for (uint64_t r = 0; r < 300; ++r) add((7 << 20) + r * 3072, 1536, at);
  REQUIRE(at < size);

  absl::Status st = pair->peer->WriteBatch(ops, kWait);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(dst->bytes == expected);
}

TEST_CASE("consecutive and concurrent batches all complete exactly once", "[transport]") {
  auto pair = MakePair();
  const size_t size = 1 << 20;
  auto src = RegisterBuffer(pair->sender, size, Access::kSource, 7);
  auto dst = RegisterBuffer(pair->receiver, size * 8, Access::kDestination, 8);
  REQUIRE(pair->peer->AddRemoteRegion(dst->desc).ok());

  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  int ok = 0;
  for (int i = 0; i < 8; ++i) {
    pair->peer->PostBatch(
        {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), i * size, size}},
        [&](absl::Status st) {
          std::lock_guard<std::mutex> lock(mu);
          ++calls;
          ok += st.ok();
          cv.notify_all();
        });
  }
  std::unique_lock<std::mutex> lock(mu);
  REQUIRE(cv.wait_for(lock, kWait, [&] { return calls == 8; }));
  lock.unlock();
  std::this_thread::sleep_for(milliseconds(50));  // a second call would show up here
  lock.lock();
  CHECK(calls == 8);
  CHECK(ok == 8);
  for (int i = 0; i < 8; ++i) CHECK(Same(dst->bytes.data() + i * size, src->bytes.data(), size));
}

// Small batches may be written by the posting thread itself (tcp: an idle connection); their
// completions must still come from a transport thread, never from inside PostBatch (callers
// post under their own locks), and batches racing from several threads must all land.
TEST_CASE("small batches from several threads land; done never runs inside PostBatch",
          "[transport]") {
  auto pair = MakePair();
  constexpr int kThreads = 4, kPerThread = 50;
  constexpr size_t kBytes = 64;
  auto src = RegisterBuffer(pair->sender, kThreads * kPerThread * kBytes, Access::kSource, 21);
  auto dst =
      RegisterBuffer(pair->receiver, kThreads * kPerThread * kBytes, Access::kDestination, 22);
  REQUIRE(pair->peer->AddRemoteRegion(dst->desc).ok());

  static thread_local bool inside_post = false;
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0, ok = 0, inside = 0;
  std::vector<int> done_of(kThreads, 0);
  auto post = [&](int t) {
    for (int i = 0; i < kPerThread; ++i) {
      const uint64_t at = (t * kPerThread + i) * kBytes;
      inside_post = true;
      pair->peer->PostBatch({WriteOp{src->desc.region_id(), at, dst->desc.region_id(), at, kBytes}},
                            [&, t](absl::Status st) {
                              std::lock_guard<std::mutex> lock(mu);
                              ++calls;
                              ++done_of[t];
                              ok += st.ok();
                              inside += inside_post;
                              cv.notify_all();
                            });
      inside_post = false;
      // Half the time wait for this thread's batches so far (the connection may go idle), the
      // other half post at once (behind batches still in flight).
      if (i % 2 == 1) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, kWait, [&] { return done_of[t] == i + 1; });
      }
    }
  };
  std::vector<std::thread> posters;
  for (int t = 0; t < kThreads; ++t) posters.emplace_back(post, t);
  for (auto& th : posters) th.join();
  std::unique_lock<std::mutex> lock(mu);
  REQUIRE(cv.wait_for(lock, kWait, [&] { return calls == kThreads * kPerThread; }));
  CHECK(ok == kThreads * kPerThread);
  CHECK(inside == 0);
  CHECK(dst->bytes == src->bytes);
}

// The receiving agent goes away while small batches (sent inline on tcp) are being posted:
// each batch still completes exactly once, none inside PostBatch, and nothing hangs.
TEST_CASE("small batches to a receiver that goes away midway each complete once", "[transport]") {
  if (BackendUnderTest() != "tcp") return;  // rdma: the VM suite; local: no connection to lose
  auto pair = MakePair();
  constexpr int kBatches = 400;
  constexpr size_t kBytes = 64;
  auto src = RegisterBuffer(pair->sender, kBatches * kBytes, Access::kSource, 31);
  auto dst = RegisterBuffer(pair->receiver, kBatches * kBytes, Access::kDestination, 32);
  REQUIRE(pair->peer->AddRemoteRegion(dst->desc).ok());

  static thread_local bool inside_post = false;
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0, ok = 0, inside = 0;
  std::thread poster([&] {
    for (int i = 0; i < kBatches; ++i) {
      const uint64_t at = i * kBytes;
      inside_post = true;
      pair->peer->PostBatch({WriteOp{src->desc.region_id(), at, dst->desc.region_id(), at, kBytes}},
                            [&](absl::Status st) {
                              std::lock_guard<std::mutex> lock(mu);
                              ++calls;
                              ok += st.ok();
                              inside += inside_post;
                              cv.notify_all();
                            });
      inside_post = false;
      if (i % 8 == 7) std::this_thread::sleep_for(milliseconds(1));
    }
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, kWait, [&] { return calls >= 20; }));
  }
  pair->receiver = nullptr;
  pair->receiver_owned.reset();  // the receiving agent is gone: its connections close
  poster.join();
  std::unique_lock<std::mutex> lock(mu);
  REQUIRE(cv.wait_for(lock, kWait, [&] { return calls == kBatches; }));
  lock.unlock();
  std::this_thread::sleep_for(milliseconds(50));  // a second completion would show up here
  lock.lock();
  CHECK(calls == kBatches);
  CHECK(ok < kBatches);  // the ones after the receiver went failed
  CHECK(inside == 0);
}

TEST_CASE("an empty batch completes with OK", "[transport]") {
  auto pair = MakePair();
  CHECK(pair->peer->WriteBatch({}, kWait).ok());
}

TEST_CASE("the receiver's arrival callback reports the batch's bytes", "[transport]") {
  auto pair = MakePair();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::string, uint64_t>> arrivals;
  pair->receiver->SetArrivalCallback([&](const std::string& peer, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    arrivals.emplace_back(peer, bytes);
    cv.notify_all();
  });
  auto src = RegisterBuffer(pair->sender, 3 << 20, Access::kSource, 9);
  auto dst = RegisterBuffer(pair->receiver, 3 << 20, Access::kDestination, 10);
  REQUIRE(pair->peer->AddRemoteRegion(dst->desc).ok());
  REQUIRE(pair->peer
              ->WriteBatch({WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 3 << 20},
                            WriteOp{src->desc.region_id(), 5, dst->desc.region_id(), 7, 100}},
                           kWait)
              .ok());
  std::unique_lock<std::mutex> lock(mu);
  REQUIRE(cv.wait_for(lock, kWait, [&] { return !arrivals.empty(); }));
  CHECK(arrivals.size() == 1);
  CHECK(arrivals[0].first == "sender");
  CHECK(arrivals[0].second == (3u << 20) + 100);
}

TEST_CASE("an out-of-bounds write is refused before anything is sent", "[transport]") {
  auto [pair, src, dst] = Link(8192, 4096, 11);
  const auto before = dst->bytes;

  absl::Status st =
      pair->peer->WriteBatch({WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 1024},
                              WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 4000, 200}},
                             kWait);
  CHECK(st.code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(std::string(st.message()), Catch::Contains("receiver") && Catch::Contains("write 1") &&
                                            Catch::Contains("out of bounds"));
  CHECK(dst->bytes == before);  // not even the valid first write landed
}

TEST_CASE("a write beyond the source region is refused", "[transport]") {
  auto [pair, src, dst] = Link(1024, 4096, 13);
  const auto before = dst->bytes;
  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 1000, dst->desc.region_id(), 0, 100}}, kWait);
  CHECK_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("out of bounds"));
  CHECK(dst->bytes == before);
}

TEST_CASE("a write to an unknown remote region is refused", "[transport]") {
  auto pair = MakePair();
  auto src = RegisterBuffer(pair->sender, 1024, Access::kSource, 15);
  absl::Status st =
      pair->peer->WriteBatch({WriteOp{src->desc.region_id(), 0, 424242, 0, 100}}, kWait);
  CHECK(st.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(st.message()), Catch::Contains("424242"));
}

// The next cases lie to the sender about the destination (as a stale or forged descriptor
// would), so the refusal has to come from the receiving side.
TEST_CASE("the receiver refuses a write with the wrong key and keeps its bytes", "[transport]") {
  auto pair = MakePair();
  auto src = RegisterBuffer(pair->sender, 8192, Access::kSource, 16);
  auto dst = RegisterBuffer(pair->receiver, 8192, Access::kDestination, 17);
  const uint64_t real_key = dst->desc.keys(0).key();
  REQUIRE(pair->peer->AddRemoteRegion(WithKey(dst->desc, real_key ^ 0x5a5a)).ok());
  const auto before = dst->bytes;

  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 8192}}, kWait);
  CHECK_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()),
             Catch::Contains("receiver") && Catch::Contains("wrong key"));
  CHECK(dst->bytes == before);

  SECTION("and the next, valid batch still lands") {
    REQUIRE(pair->peer->AddRemoteRegion(dst->desc).ok());
    absl::Status again = pair->peer->WriteBatch(
        {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 8192}}, kWait);
    INFO(again.ToString());
    CHECK(again.ok());
    CHECK(dst->bytes == src->bytes);
  }
}

TEST_CASE("the receiver refuses a write past the end of its region", "[transport]") {
  auto pair = MakePair();
  auto src = RegisterBuffer(pair->sender, 8192, Access::kSource, 18);
  auto dst = RegisterBuffer(pair->receiver, 4096, Access::kDestination, 19);
  REQUIRE(pair->peer->AddRemoteRegion(WithLength(dst->desc, 8192)).ok());
  const auto before = dst->bytes;

  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 2048, 4096}}, kWait);
  CHECK_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("out of bounds"));
  CHECK(dst->bytes == before);
}

TEST_CASE("nothing lands in a withdrawn region", "[transport]") {
  auto [pair, src, dst] = Link(4096, 4096, 20);
  REQUIRE(pair->receiver->Deregister(dst->desc.region_id()).ok());
  const auto before = dst->bytes;

  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 4096}}, kWait);
  CHECK_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("not registered"));
  CHECK(dst->bytes == before);
}

// Withdrawal then registration of the same memory (a process re-registering its tensor after a
// layout change) must not revive the old key. rdma rkeys come from the NIC (8 variable bits on
// rxe and mlx5), so this case runs for the software backends, whose keys are 64 random bits.
TEST_CASE("after re-registration the old descriptor and the old key are refused", "[transport]") {
  if (BackendUnderTest() == "rdma") return;
  auto pair = MakePair();
  auto src = RegisterBuffer(pair->sender, 4096, Access::kSource, 24);
  auto dst = RegisterBuffer(pair->receiver, 4096, Access::kDestination, 25);
  const weightbeam::v1::RegionDescriptor old_desc = dst->desc;
  REQUIRE(pair->peer->AddRemoteRegion(old_desc).ok());
  REQUIRE(pair->receiver->Deregister(old_desc.region_id()).ok());
  MemoryRef mem{dst->bytes.data(), dst->bytes.size(), MemoryKind::kHost, -1};
  auto fresh = pair->receiver->Register(mem, Access::kDestination);
  REQUIRE(fresh.ok());
  CHECK(fresh->region_id() != old_desc.region_id());
  CHECK(fresh->keys(0).key() != old_desc.keys(0).key());
  const auto before = dst->bytes;

  // The sender still holds the old descriptor.
  absl::Status stale = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, old_desc.region_id(), 0, 4096}}, kWait);
  CHECK_FALSE(stale.ok());
  CHECK_THAT(std::string(stale.message()), Catch::Contains("not registered"));
  // The new region under the old key.
  REQUIRE(pair->peer->AddRemoteRegion(WithKey(*fresh, old_desc.keys(0).key())).ok());
  absl::Status old_key = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, fresh->region_id(), 0, 4096}}, kWait);
  CHECK_FALSE(old_key.ok());
  CHECK_THAT(std::string(old_key.message()), Catch::Contains("wrong key"));
  CHECK(dst->bytes == before);

  // The fresh descriptor works.
  REQUIRE(pair->peer->AddRemoteRegion(*fresh).ok());
  absl::Status ok = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, fresh->region_id(), 0, 4096}}, kWait);
  INFO(ok.ToString());
  CHECK(ok.ok());
  CHECK(dst->bytes == src->bytes);
}

// A receiver that forgets a sender (the controller no longer introduces it) revokes what the
// handshake gave it: its writes are refused and nothing lands.
TEST_CASE("a sender the receiver forgot cannot write any more", "[transport]") {
  if (BackendUnderTest() != "tcp") return;  // tcp: tokens; rdma: queue pairs (VM suite)
  auto [pair, src, dst] = Link(4096, 4096, 26);
  REQUIRE(pair->peer
              ->WriteBatch({WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 64}}, kWait)
              .ok());
  pair->receiver->ForgetPeer("sender");
  FillPattern(src->bytes.data(), src->bytes.size(), 28);
  const auto before = dst->bytes;
  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 4096}}, kWait);
  CHECK_FALSE(st.ok());
  CHECK(dst->bytes == before);
}

// Two agents that send to each other: when one reconnects its own direction (as before a step
// after a failed one, or a new plan), the other direction keeps working.
TEST_CASE("reconnecting one direction leaves the reverse direction working", "[transport]") {
  auto pair = MakePair();
  if (!pair->sender->caps().remote) return;  // local: one transport, no directions
  Transport* a = pair->sender;
  Transport* b = pair->receiver;
  auto reverse = b->Connect("receiver", "sender", [a](const std::string& record) {
    return a->Accept("receiver", record);
  });
  REQUIRE(reverse.ok());
  auto a_src = RegisterBuffer(a, 4096, Access::kSource, 40);
  auto a_dst = RegisterBuffer(a, 4096, Access::kDestination, 41);
  auto b_src = RegisterBuffer(b, 4096, Access::kSource, 42);
  auto b_dst = RegisterBuffer(b, 4096, Access::kDestination, 43);
  REQUIRE((*reverse)->AddRemoteRegion(a_dst->desc).ok());

  a->ForgetPeer("receiver", PeerSide::kOutgoing);
  auto forward = a->Connect("sender", "receiver",
                            [b](const std::string& record) { return b->Accept("sender", record); });
  INFO(forward.status().ToString());
  REQUIRE(forward.ok());
  REQUIRE((*forward)->AddRemoteRegion(b_dst->desc).ok());

  absl::Status back = (*reverse)->WriteBatch(
      {WriteOp{b_src->desc.region_id(), 0, a_dst->desc.region_id(), 0, 4096}}, kWait);
  INFO(back.ToString());
  CHECK(back.ok());
  CHECK(a_dst->bytes == b_src->bytes);
  absl::Status forth = (*forward)->WriteBatch(
      {WriteOp{a_src->desc.region_id(), 0, b_dst->desc.region_id(), 0, 4096}}, kWait);
  INFO(forth.ToString());
  CHECK(forth.ok());
  CHECK(b_dst->bytes == a_src->bytes);
}

TEST_CASE("a source region does not accept remote writes", "[transport]") {
  auto pair = MakePair();
  auto src = RegisterBuffer(pair->sender, 4096, Access::kSource, 22);
  auto other = RegisterBuffer(pair->receiver, 4096, Access::kSource, 23);
  // Forge a tcp/local/rdma key for a region that was registered as a source.
  REQUIRE(pair->peer->AddRemoteRegion(WithKey(other->desc, 12345)).ok());
  const auto before = other->bytes;
  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, other->desc.region_id(), 0, 4096}}, kWait);
  CHECK_FALSE(st.ok());
  CHECK(other->bytes == before);
}

TEST_CASE("the step fence lands only the open step's writes", "[transport][fence]") {
  auto pair = MakePair();
  if (BackendUnderTest() == "rdma") return;  // one-sided: fenced by connection (next case)
  auto src = RegisterBuffer(pair->sender, 4096, Access::kSource, 31);
  auto dst = RegisterBuffer(pair->receiver, 4096, Access::kDestination, 32);
  REQUIRE(pair->peer->AddRemoteRegion(dst->desc).ok());
  std::atomic<int> fenced{0};
  pair->receiver->SetFenceCallback([&](const std::string&, uint64_t) { ++fenced; });
  const auto before = dst->bytes;
  auto write = [&](uint64_t step, uint64_t offset) {
    WriteOp op{src->desc.region_id(), offset, dst->desc.region_id(), offset, 64};
    op.step = step;
    return pair->peer->WriteBatch({op}, kWait);
  };
  auto landed = [&](uint64_t offset) {
    return Same(dst->bytes.data() + offset, src->bytes.data() + offset, 64);
  };
  auto untouched = [&](uint64_t offset) {
    return Same(dst->bytes.data() + offset, before.data() + offset, 64);
  };

  REQUIRE(pair->receiver->OpenStep(7).ok());
  absl::Status st = write(7, 0);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(landed(0));
  // A write of another step (an aborted or timed-out one's) is refused before it lands.
  st = write(8, 128);
  CHECK_THAT(std::string(st.message()),
             Catch::Contains("write of step 8 refused") && Catch::Contains("accepts step 7"));
  CHECK(untouched(128));
  CHECK(pair->receiver->RefusedWrites(8) == 1);
  CHECK(pair->receiver->RefusedWrites(7) == 0);
  // Closed (committed or aborted): nothing lands, not even the step's own writes.
  REQUIRE(pair->receiver->CloseStep(true).ok());
  st = write(7, 256);
  CHECK_THAT(std::string(st.message()), Catch::Contains("no step is open"));
  CHECK(untouched(256));
  CHECK(pair->receiver->RefusedWrites(7) == 1);
  // The next step's writes land again on the same connections.
  REQUIRE(pair->receiver->OpenStep(9).ok());
  st = write(9, 512);
  INFO(st.ToString());
  CHECK(st.ok());
  CHECK(landed(512));
  CHECK(fenced == 2);
}

TEST_CASE("rdma: an aborted step's incoming connections are cut", "[transport][fence]") {
  if (BackendUnderTest() != "rdma") return;  // tcp and local refuse by step (case above)
  auto [pair, src, dst] = Link(4096, 4096, 33);
  const auto before = dst->bytes;
  REQUIRE(pair->receiver->OpenStep(1).ok());
  absl::Status st = pair->peer->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, dst->desc.region_id(), 0, 64}}, kWait);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(pair->receiver->CloseStep(false).ok());
  st = pair->peer->WriteBatch({WriteOp{src->desc.region_id(), 128, dst->desc.region_id(), 128, 64}},
                              kWait);
  CHECK_FALSE(st.ok());
  CHECK(Same(dst->bytes.data() + 128, before.data() + 128, 64));
}

TEST_CASE("an unknown transport name lists the known ones", "[transport][factory]") {
  auto transport = MakeTransport("carrier-pigeon", TestConfig());
  CHECK(transport.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(transport.status().message()), Catch::Contains("carrier-pigeon") &&
                                                            Catch::Contains("tcp") &&
                                                            Catch::Contains("local"));
}

}  // namespace
}  // namespace wb::transport::testing
