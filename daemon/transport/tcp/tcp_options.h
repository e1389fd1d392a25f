// Settings of the tcp transport, built from the agent's typed configuration.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"

namespace wb::transport::tcp {

struct TcpOptions {
  std::string listen = "0.0.0.0:0";  // data-plane listener; port 0 picks a free one
  std::string advertise_host;        // what peers connect to; empty: derived from listen
  int connections_per_peer = 4;
  uint64_t max_frame_bytes = uint64_t{64} << 20;  // largest WRITE payload we accept / send
  // A batch fails when no byte or acknowledgement moved for this long; also the socket
  // send/receive stall limit.
  std::chrono::milliseconds write_timeout{30000};
  std::chrono::milliseconds connect_timeout{10000};
  int socket_buffer_bytes = 0;  // SO_SNDBUF/SO_RCVBUF; 0 keeps Linux's autotuning
  // An accepted connection must complete its HELLO within this.
  std::chrono::milliseconds handshake_timeout{5000};
  // Connections from one source address that have not presented a valid HELLO yet; a new one
  // beyond this closes the oldest.
  int max_unauthenticated_per_source = 16;
  double gbps = 0;  // the rail's rate for the planner; 0: derived (link_rate.h)
};

// From `agent.tcp` (+ `agent.executor.write_timeout_ms`, `agent.advertise_host`); checks ranges.
absl::StatusOr<TcpOptions> TcpOptionsFromConfig(const wb::config::AgentConfig& config);

}  // namespace wb::transport::tcp
