// The transport suite across processes: the test forks a receiver that builds its own
// transport, answers the handshake and sends its region descriptor over a socketpair, and on
// request sends its region's bytes back. Tagged [remote]: backends without remote peers
// (local) skip them with the filter "~[remote]".
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "daemon/transport/factory.h"
#include "tests/transport/suite_util.h"

namespace wb::transport::testing {
namespace {

using std::chrono::milliseconds;

// Runs in the forked child; never returns.
[[noreturn]] void ReceiverMain(int fd, size_t region_bytes, uint32_t seed) {
  auto transport = MakeTransport(BackendUnderTest(), TestConfig());
  if (!transport.ok()) _exit(2);
  std::vector<uint8_t> region = Pattern(region_bytes, seed);
  MemoryRef mem{region.data(), region.size()};
  auto desc = (*transport)->Register(mem, Access::kDestination);
  if (!desc.ok()) _exit(3);
  auto record = ReceiveMessage(fd);
  if (!record.ok()) _exit(4);
  auto reply = (*transport)->Accept("sender", *record);
  if (!reply.ok() || !SendMessage(fd, *reply) || !SendMessage(fd, desc->SerializeAsString())) {
    _exit(5);
  }
  while (true) {
    auto command = ReceiveMessage(fd);
    if (!command.ok() || *command == "exit") break;
    if (*command == "dump") {
      SendMessage(fd, std::string(region.begin(), region.end()));
    }
  }
  transport->reset();
  _exit(0);
}

// A receiver process and a connected peer to it. Forks before the test builds its own
// transport, so the child starts without the parent's transport threads.
class RemoteReceiver {
 public:
  RemoteReceiver(size_t region_bytes, uint32_t seed) {
    int fds[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that crashed
      ::close(fds[0]);
      ReceiverMain(fds[1], region_bytes, seed);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }

  ~RemoteReceiver() {
    peer_.reset();
    if (pid_ > 0) {
      SendMessage(fd_, "exit");
      kill(pid_, SIGCONT);
      Reap();
    }
    ::close(fd_);
  }

  void Connect(Transport* sender) {
    const int fd = fd_;
    auto peer = sender->Connect("sender", "receiver",
                                [fd](const std::string& record) -> absl::StatusOr<std::string> {
                                  if (!SendMessage(fd, record))
                                    return absl::UnavailableError("receiver process is gone");
                                  return ReceiveMessage(fd);
                                });
    INFO(peer.status().ToString());
    REQUIRE(peer.ok());
    peer_ = *peer;
    auto desc = ReceiveMessage(fd_);
    REQUIRE(desc.ok());
    REQUIRE(desc_.ParseFromString(*desc));
    REQUIRE(peer_->AddRemoteRegion(desc_).ok());
  }

  std::vector<uint8_t> Dump() {
    REQUIRE(SendMessage(fd_, "dump"));
    auto bytes = ReceiveMessage(fd_);
    REQUIRE(bytes.ok());
    return std::vector<uint8_t>(bytes->begin(), bytes->end());
  }

  void Signal(int sig) { kill(pid_, sig); }
  void Reap() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  Peer* peer() { return peer_.get(); }
  uint64_t region() const { return desc_.region_id(); }
  const weightbeam::v1::RegionDescriptor& desc() const { return desc_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::shared_ptr<Peer> peer_;
  weightbeam::v1::RegionDescriptor desc_;
};

// `n` writes of a 16 MiB source's first 16 MiB into the four 16 MiB quarters of a 64 MiB
// destination region, in turn.
std::vector<WriteOp> QuarterWrites(uint64_t src_region, uint64_t dst_region, uint64_t n) {
  std::vector<WriteOp> ops;
  for (uint64_t i = 0; i < n; ++i) {
    ops.push_back(WriteOp{src_region, 0, dst_region, (i % 4) << 24, 16 << 20});
  }
  return ops;
}

TEST_CASE("writes land in a receiver process, refused ones do not", "[transport][remote]") {
  const size_t size = 6 << 20;
  RemoteReceiver receiver(size, 31);
  auto sender = MakeBackend();
  receiver.Connect(sender.get());
  auto src = RegisterBuffer(sender.get(), size, Access::kSource, 32);

  std::vector<uint8_t> expected = Pattern(size, 31);  // the receiver's initial bytes
  std::vector<WriteOp> ops;
  // One large write across connections, then many small ones at odd offsets.
  ops.push_back(WriteOp{src->desc.region_id(), 0, receiver.region(), 0, 4 << 20});
  std::memcpy(expected.data(), src->bytes.data(), 4 << 20);
  for (uint64_t i = 0; i < 300; ++i) {
    const uint64_t dst = (4 << 20) + i * 3001;
    const uint64_t from = i * 12345;
    ops.push_back(WriteOp{src->desc.region_id(), from, receiver.region(), dst, 2000});
    std::memcpy(expected.data() + dst, src->bytes.data() + from, 2000);
  }
  absl::Status st = receiver.peer()->WriteBatch(ops, std::chrono::seconds(30));
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(receiver.Dump() == expected);

  // A forged key: the receiver refuses it and its bytes stay as they were.
  REQUIRE(receiver.peer()->AddRemoteRegion(WithKey(receiver.desc(), 99)).ok());
  st = receiver.peer()->WriteBatch(
      {WriteOp{src->desc.region_id(), 0, receiver.region(), 1 << 20, 1 << 20}},
      std::chrono::seconds(30));
  CHECK_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("wrong key"));
  CHECK(receiver.Dump() == expected);
}

TEST_CASE("a receiver killed mid-batch fails the batch, naming the peer", "[transport][remote]") {
  RemoteReceiver receiver(64 << 20, 41);
  auto sender = MakeBackend();
  receiver.Connect(sender.get());
  auto src = RegisterBuffer(sender.get(), 16 << 20, Access::kSource, 42);
  // 4 GiB in one batch: far more than can land before the kill.
  const std::vector<WriteOp> ops = QuarterWrites(src->desc.region_id(), receiver.region(), 256);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status result;
  receiver.peer()->PostBatch(ops, [&](absl::Status st) {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    result = st;
    cv.notify_all();
  });
  receiver.Signal(SIGKILL);
  receiver.Reap();
  std::unique_lock<std::mutex> lock(mu);
  REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; }));
  CHECK_FALSE(result.ok());
  CHECK_THAT(std::string(result.message()), Catch::Contains("receiver"));

  SECTION("and later batches fail at once") {
    lock.unlock();
    absl::Status again = receiver.peer()->WriteBatch(
        {WriteOp{src->desc.region_id(), 0, receiver.region(), 0, 100}}, std::chrono::seconds(30));
    CHECK_FALSE(again.ok());
    CHECK_THAT(std::string(again.message()), Catch::Contains("receiver"));
  }
}

TEST_CASE("a receiver that stops responding fails the batch after the write timeout",
          "[transport][remote]") {
  RemoteReceiver receiver(64 << 20, 51);
  auto sender = MakeBackend();
  receiver.Connect(sender.get());
  auto src = RegisterBuffer(sender.get(), 16 << 20, Access::kSource, 52);
  const std::vector<WriteOp> ops = QuarterWrites(src->desc.region_id(), receiver.region(), 64);
  receiver.Signal(SIGSTOP);
  // The WriteBatch limit is far above the configured 3 s write timeout: the transport itself
  // has to notice that nothing moves.
  absl::Status st = receiver.peer()->WriteBatch(ops, std::chrono::seconds(60));
  CHECK(st.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(st.message()), Catch::Contains("receiver"));
  receiver.Signal(SIGKILL);
}

}  // namespace
}  // namespace wb::transport::testing
