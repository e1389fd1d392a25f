#include "tests/transport/suite_util.h"

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/transport/factory.h"

namespace wb::transport::testing {

std::string BackendUnderTest() {
  const char* name = std::getenv("WB_TEST_TRANSPORT");
  return name != nullptr && *name != '\0' ? name : "tcp";
}

wb::config::AgentConfig TestConfig() {
  wb::config::AgentConfig config;
  config.source = "<transport test>";
  config.tcp.listen = "127.0.0.1:0";
  config.tcp.connections_per_peer = 3;
  config.tcp.max_frame_bytes = 1 << 20;
  config.executor.write_timeout_ms = 3000;
  config.rdma.enabled = true;
  if (const char* device = std::getenv("WB_TEST_RDMA_DEVICE")) config.rdma.devices = {device};
  return config;
}

std::unique_ptr<Transport> MakeBackend() {
  auto transport = MakeTransport(BackendUnderTest(), TestConfig());
  INFO(transport.status().ToString());
  REQUIRE(transport.ok());
  return std::move(*transport);
}

void FillPattern(uint8_t* data, size_t size, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 0x9e3779b9u;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    data[i] = static_cast<uint8_t>(x);
  }
}

std::vector<uint8_t> Pattern(size_t size, uint32_t seed) {
  std::vector<uint8_t> out(size);
  FillPattern(out.data(), size, seed);
  return out;
}

std::unique_ptr<Buffer> RegisterBuffer(Transport* transport, size_t size, Access access,
                                       uint32_t seed) {
  auto buffer = std::make_unique<Buffer>();
  buffer->bytes = Pattern(size, seed);
  MemoryRef mem;
  mem.addr = buffer->bytes.data();
  mem.length = size;
  auto desc = transport->Register(mem, access);
  INFO(desc.status().ToString());
  REQUIRE(desc.ok());
  buffer->desc = *desc;
  return buffer;
}

std::unique_ptr<Pair> MakePair() {
  auto pair = std::make_unique<Pair>();
  pair->sender_owned = MakeBackend();
  pair->sender = pair->sender_owned.get();
  if (pair->sender->caps().remote) {
    pair->receiver_owned = MakeBackend();
    pair->receiver = pair->receiver_owned.get();
  } else {
    pair->receiver = pair->sender;
  }
  Transport* receiver = pair->receiver;
  auto peer = pair->sender->Connect("sender", "receiver", [receiver](const std::string& record) {
    return receiver->Accept("sender", record);
  });
  INFO(peer.status().ToString());
  REQUIRE(peer.ok());
  pair->peer = *peer;
  return pair;
}

weightbeam::v1::RegionDescriptor WithKey(weightbeam::v1::RegionDescriptor desc, uint64_t key) {
  desc.mutable_keys(0)->set_key(key);
  return desc;
}

weightbeam::v1::RegionDescriptor WithLength(weightbeam::v1::RegionDescriptor desc,
                                            uint64_t length) {
  desc.set_length(length);
  return desc;
}

namespace {

bool WriteAll(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);  // a dead receiver must not SIGPIPE us
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t size) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

bool SendMessage(int fd, const std::string& message) {
  uint64_t size = message.size();
  return WriteAll(fd, &size, sizeof(size)) && WriteAll(fd, message.data(), message.size());
}

absl::StatusOr<std::string> ReceiveMessage(int fd) {
  uint64_t size = 0;
  if (!ReadAll(fd, &size, sizeof(size))) return absl::UnavailableError("control channel closed");
  std::string message(size, '\0');
  if (!ReadAll(fd, message.data(), size)) {
    return absl::UnavailableError("control channel closed mid-message");
  }
  return message;
}

}  // namespace wb::transport::testing
