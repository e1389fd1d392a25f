// The tcp transport's receiving side against hand-made frames: only introduced peers are
// served, and malformed, oversized or refused frames never touch registered memory.
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/net/socket_util.h"
#include "daemon/transport/tcp/frame.h"
#include "daemon/transport/tcp/tcp_transport.h"
#include "weightbeam/v1/transport.pb.h"

namespace wb::transport::tcp {
namespace {

struct Receiver {
  std::unique_ptr<TcpTransport> transport;
  std::vector<uint8_t> memory = std::vector<uint8_t>(1 << 16, 0xAB);
  weightbeam::v1::RegionDescriptor desc;

  Receiver() {
    TcpOptions options;
    options.listen = "127.0.0.1:0";
    options.max_frame_bytes = 8192;
    options.write_timeout = std::chrono::milliseconds(2000);
    auto created = TcpTransport::Create(options);
    REQUIRE(created.ok());
    transport = std::move(*created);
    auto registered =
        transport->Register(MemoryRef{memory.data(), memory.size()}, Access::kDestination);
    REQUIRE(registered.ok());
    desc = *registered;
  }
  uint64_t key() const { return desc.keys(0).key(); }
  bool Untouched() const {
    for (uint8_t b : memory) {
      if (b != 0xAB) return false;
    }
    return true;
  }
};

net::UniqueFd Dial(const Receiver& receiver) {
  auto where = net::ParseHostPort(receiver.transport->endpoint());
  REQUIRE(where.ok());
  auto fd = net::ConnectTcp(*where, std::chrono::milliseconds(2000));
  REQUIRE(fd.ok());
  REQUIRE(net::TuneSocket(fd->get(), 0, std::chrono::milliseconds(5000),
                          std::chrono::milliseconds(5000))
              .ok());
  return std::move(*fd);
}

void SendFrame(int fd, const FrameHeader& header, const std::string& payload = "") {
  uint8_t raw[kFrameHeaderBytes];
  EncodeFrameHeader(header, raw);
  REQUIRE(net::SendAll(fd, raw, sizeof(raw)).ok());
  if (!payload.empty()) REQUIRE(net::SendAll(fd, payload.data(), payload.size()).ok());
}

void SendHello(int fd, const std::string& token) {
  weightbeam::v1::TcpHello hello;
  hello.set_from_agent("raw-client");
  hello.set_token(token);
  FrameHeader header;
  header.type = FrameType::kHello;
  const std::string payload = hello.SerializeAsString();
  header.length = payload.size();
  SendFrame(fd, header, payload);
}

// A WRITE of `length` bytes at `offset` into the receiver's region, under its key.
FrameHeader WriteTo(const Receiver& receiver, uint64_t offset, uint64_t length, uint64_t batch_id) {
  FrameHeader write;
  write.type = FrameType::kWrite;
  write.region_id = receiver.desc.region_id();
  write.key = receiver.key();
  write.offset = offset;
  write.length = length;
  write.batch_id = batch_id;
  return write;
}

// The FLUSH that ends batch `batch_id` sent over one connection.
FrameHeader FlushOf(uint64_t batch_id) {
  FrameHeader flush;
  flush.type = FrameType::kFlush;
  flush.aux = 1;
  flush.batch_id = batch_id;
  return flush;
}

// The next frame from the receiver, or nullopt when it closed the connection.
std::optional<std::pair<FrameHeader, std::string>> ReadFrame(int fd) {
  uint8_t raw[kFrameHeaderBytes];
  size_t got = 0;
  if (net::RecvExact(fd, raw, sizeof(raw), &got, nullptr) != net::RecvOutcome::kOk)
    return std::nullopt;
  auto header = ParseFrameHeader(raw, sizeof(raw));
  REQUIRE(header.ok());
  std::string payload(header->length, '\0');
  if (net::RecvExact(fd, payload.data(), payload.size(), &got, nullptr) != net::RecvOutcome::kOk) {
    return std::nullopt;
  }
  return std::make_pair(*header, payload);
}

std::string TokenFor(Receiver& receiver) {
  weightbeam::v1::TcpHello initiator;
  initiator.set_from_agent("raw-client");
  auto reply = receiver.transport->Accept("raw-client", initiator.SerializeAsString());
  REQUIRE(reply.ok());
  weightbeam::v1::TcpHello hello;
  REQUIRE(hello.ParseFromString(*reply));
  CHECK(hello.token().size() == 16);
  return hello.token();
}

// The next frame from the receiver, REQUIREd to be there and of type `type`.
std::pair<FrameHeader, std::string> NextFrameOf(int fd, FrameType type) {
  auto frame = ReadFrame(fd);
  REQUIRE(frame.has_value());
  CHECK(frame->first.type == type);
  return *frame;
}

// A connection that said HELLO with `token` and was acknowledged.
net::UniqueFd DialIntroduced(const Receiver& receiver, const std::string& token) {
  net::UniqueFd fd = Dial(receiver);
  SendHello(fd.get(), token);
  NextFrameOf(fd.get(), FrameType::kAck);
  return fd;
}

TEST_CASE("a connection with an unknown token is closed without an answer", "[tcp]") {
  Receiver receiver;
  TokenFor(receiver);  // some other token exists
  net::UniqueFd fd = Dial(receiver);
  SendHello(fd.get(), std::string(16, 'x'));
  CHECK_FALSE(ReadFrame(fd.get()).has_value());
}

TEST_CASE("a write before HELLO closes the connection and lands nowhere", "[tcp]") {
  Receiver receiver;
  net::UniqueFd fd = Dial(receiver);
  SendFrame(fd.get(), WriteTo(receiver, 0, 16, 0), std::string(16, 'z'));
  CHECK_FALSE(ReadFrame(fd.get()).has_value());
  CHECK(receiver.Untouched());
}

TEST_CASE("hand-made frames from an introduced peer", "[tcp]") {
  Receiver receiver;
  net::UniqueFd fd = DialIntroduced(receiver, TokenFor(receiver));

  SECTION("a valid write lands and its FLUSH is acknowledged") {
    SendFrame(fd.get(), WriteTo(receiver, 10, 5, 1), "hello");
    SendFrame(fd.get(), FlushOf(1));
    CHECK(NextFrameOf(fd.get(), FrameType::kAck).first.batch_id == 1);
    CHECK(std::memcmp(receiver.memory.data() + 10, "hello", 5) == 0);
    CHECK(receiver.memory[9] == 0xAB);
    CHECK(receiver.memory[15] == 0xAB);
  }

  SECTION("a refused write is NACKed with the reason and the connection keeps serving") {
    // 4 bytes past the end.
    SendFrame(fd.get(), WriteTo(receiver, receiver.memory.size() - 4, 8, 2), "12345678");
    auto nack = NextFrameOf(fd.get(), FrameType::kNack);
    CHECK(nack.first.batch_id == 2);
    CHECK_THAT(nack.second, Catch::Contains("out of bounds"));
    CHECK(receiver.Untouched());

    SendFrame(fd.get(), FlushOf(2));
    NextFrameOf(fd.get(), FrameType::kAck);
  }

  SECTION("an oversized frame is NACKed and the connection closed") {
    SendFrame(fd.get(), WriteTo(receiver, 0, 8193, 3));  // max_frame_bytes is 8192
    CHECK_THAT(NextFrameOf(fd.get(), FrameType::kNack).second, Catch::Contains("max_frame_bytes"));
    CHECK_FALSE(ReadFrame(fd.get()).has_value());
    CHECK(receiver.Untouched());
  }

  SECTION("a garbage header closes the connection") {
    const std::string junk(kFrameHeaderBytes, '\x7f');
    REQUIRE(net::SendAll(fd.get(), junk.data(), junk.size()).ok());
    CHECK_FALSE(ReadFrame(fd.get()).has_value());
    CHECK(receiver.Untouched());
  }
}

TEST_CASE("forgetting a peer closes its connections and retires its token", "[tcp]") {
  Receiver receiver;
  const std::string token = TokenFor(receiver);
  net::UniqueFd fd = DialIntroduced(receiver, token);

  receiver.transport->ForgetPeer("raw-client");
  CHECK_FALSE(ReadFrame(fd.get()).has_value());

  net::UniqueFd again = Dial(receiver);
  SendHello(again.get(), token);
  CHECK_FALSE(ReadFrame(again.get()).has_value());
}

// Waits (up to 5 s) until the receiver has read everything sent on `fd` so far: a write 4 bytes
// past the end is NACKed only after every frame before it was handled.
void Sync(int fd, const Receiver& receiver, uint64_t step = 0) {
  FrameHeader probe = WriteTo(receiver, receiver.memory.size() - 4, 8, ~uint64_t{0});
  probe.step = step;
  SendFrame(fd, probe, "12345678");
  NextFrameOf(fd, FrameType::kNack);
}

TEST_CASE("a peer's unfinished batches are bounded and dropped when their step is over",
          "[tcp][security]") {
  Receiver receiver;
  const std::string token = TokenFor(receiver);

  SECTION("fresh batch ids that never FLUSH keep at most the bound") {
    net::UniqueFd fd = DialIntroduced(receiver, token);
    const uint64_t batches = 4 * TcpReceiver::kMaxOpenBatchesPerPeer;
    for (uint64_t id = 1; id <= batches; ++id) {
      SendFrame(fd.get(), WriteTo(receiver, id % 1000, 1, id), "w");
    }
    Sync(fd.get(), receiver);
    CHECK(receiver.transport->OpenBatches() <= TcpReceiver::kMaxOpenBatchesPerPeer);
    // The latest batches are the ones kept: a FLUSH still completes normally.
    SendFrame(fd.get(), FlushOf(batches));
    CHECK(NextFrameOf(fd.get(), FrameType::kAck).first.batch_id == batches);
  }

  SECTION("moving the step fence drops the batches it cut") {
    net::UniqueFd fd = DialIntroduced(receiver, token);
    REQUIRE(receiver.transport->OpenStep(7).ok());
    FrameHeader landed = WriteTo(receiver, 0, 4, 100);
    landed.step = 7;
    SendFrame(fd.get(), landed, "land");
    FrameHeader refused = WriteTo(receiver, 8, 4, 101);
    refused.step = 6;  // an older step's write: NACKed, its batch marked refused
    SendFrame(fd.get(), refused, "late");
    NextFrameOf(fd.get(), FrameType::kNack);
    Sync(fd.get(), receiver, 7);
    CHECK(receiver.transport->OpenBatches() >= 2);
    // Step 7 is aborted and step 8 begins: neither FLUSH will ever come.
    REQUIRE(receiver.transport->OpenStep(8).ok());
    CHECK(receiver.transport->OpenBatches() == 0);
    FrameHeader next = WriteTo(receiver, 16, 4, 102);
    next.step = 8;
    SendFrame(fd.get(), next, "next");
    Sync(fd.get(), receiver, 8);
    REQUIRE(receiver.transport->CloseStep(false).ok());
    CHECK(receiver.transport->OpenBatches() == 0);
  }

  SECTION("a peer whose connections all closed leaves nothing behind") {
    {
      net::UniqueFd fd = DialIntroduced(receiver, token);
      for (uint64_t id = 1; id <= 10; ++id) {
        SendFrame(fd.get(), WriteTo(receiver, id, 1, id), "a");
      }
      Sync(fd.get(), receiver);
      CHECK(receiver.transport->OpenBatches() >= 10);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (receiver.transport->OpenBatches() != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(receiver.transport->OpenBatches() == 0);
  }
}

TEST_CASE("Connect fails clearly when the peer does not know our token", "[tcp]") {
  Receiver receiver;
  TcpOptions options;
  options.listen = "127.0.0.1:0";
  auto sender = TcpTransport::Create(options);
  REQUIRE(sender.ok());
  auto peer = (*sender)->Connect("sender", "receiver", [&](const std::string&) {
    weightbeam::v1::TcpHello forged;
    forged.set_token(std::string(16, 'f'));
    forged.set_endpoint(receiver.transport->endpoint());
    return absl::StatusOr<std::string>(forged.SerializeAsString());
  });
  CHECK(peer.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(peer.status().message()),
             Catch::Contains("receiver") && Catch::Contains("handshake refused"));
}

}  // namespace
}  // namespace wb::transport::tcp
