#include "daemon/transport/tcp/tcp_options.h"

#include "absl/strings/str_cat.h"
#include "common/net/socket_util.h"

namespace wb::transport::tcp {

absl::StatusOr<TcpOptions> TcpOptionsFromConfig(const wb::config::AgentConfig& config) {
  TcpOptions options;
  options.listen = config.tcp.listen;
  options.advertise_host =
      !config.tcp.advertise_host.empty() ? config.tcp.advertise_host : config.advertise_host;
  options.connections_per_peer = config.tcp.connections_per_peer;
  options.max_frame_bytes = config.tcp.max_frame_bytes;
  options.write_timeout = std::chrono::milliseconds(config.executor.write_timeout_ms);
  options.handshake_timeout = std::chrono::milliseconds(config.tcp.handshake_timeout_ms);
  options.max_unauthenticated_per_source = config.tcp.max_unauthenticated_per_source;
  options.gbps = config.tcp.gbps;
  const std::string where = config.source.empty() ? "agent config" : config.source;
  if (auto parsed = net::ParseHostPort(options.listen); !parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tcp.listen: ", parsed.status().message()));
  }
  if (options.connections_per_peer < 1 || options.connections_per_peer > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tcp.connections_per_peer must be in [1, 64], got ",
                     options.connections_per_peer));
  }
  if (options.max_frame_bytes < 4096 || options.max_frame_bytes > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": tcp.max_frame_bytes must be in [4096, 2^31], got ", options.max_frame_bytes));
  }
  if (!(options.gbps >= 0 && options.gbps <= 10000)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tcp.gbps must be in [0, 10000] (0: derived), got ", options.gbps));
  }
  if (options.write_timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": executor.write_timeout_ms must be positive"));
  }
  return options;
}

}  // namespace wb::transport::tcp
