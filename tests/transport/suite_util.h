// Helpers of the transport test suite: pick the backend under test (WB_TEST_TRANSPORT=tcp,
// local, rdma), build transports from a test config, register patterned buffers, and pass
// length-prefixed messages between a test and its forked receiver process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "daemon/transport/transport.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::transport::testing {

// The backend under test: $WB_TEST_TRANSPORT, default "tcp".
std::string BackendUnderTest();
// Loopback listeners, 3 connections, 1 MiB frames (so large writes are split), 3 s write
// timeout. $WB_TEST_RDMA_DEVICE selects the rdma device.
wb::config::AgentConfig TestConfig();
std::unique_ptr<Transport> MakeBackend();

// A deterministic byte pattern; different seeds give different bytes everywhere.
void FillPattern(uint8_t* data, size_t size, uint32_t seed);
std::vector<uint8_t> Pattern(size_t size, uint32_t seed);

struct Buffer {
  std::vector<uint8_t> bytes;
  weightbeam::v1::RegionDescriptor desc;
};
std::unique_ptr<Buffer> RegisterBuffer(Transport* transport, size_t size, Access access,
                                       uint32_t seed);

// Sender and receiver in this process: two transports for remote backends, one for local.
struct Pair {
  std::unique_ptr<Transport> sender_owned;
  std::unique_ptr<Transport> receiver_owned;
  Transport* sender = nullptr;
  Transport* receiver = nullptr;
  std::shared_ptr<Peer> peer;  // sender -> receiver
};
std::unique_ptr<Pair> MakePair();

// The descriptor as a peer would see it with one field of its first key changed.
weightbeam::v1::RegionDescriptor WithKey(weightbeam::v1::RegionDescriptor desc, uint64_t key);
weightbeam::v1::RegionDescriptor WithLength(weightbeam::v1::RegionDescriptor desc, uint64_t length);

// Length-prefixed messages over a socket or pipe (blocking). Receive fails on EOF.
bool SendMessage(int fd, const std::string& message);
absl::StatusOr<std::string> ReceiveMessage(int fd);

}  // namespace wb::transport::testing
