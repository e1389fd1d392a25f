// Builds a transport backend by name ("tcp", "local", ...) from the agent's configuration.
// Backends are listed in one table in factory.cc; adding one is one line there plus a dep.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "daemon/transport/transport.h"

namespace wb::transport {

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name,
                                                         const wb::config::AgentConfig& config);

// The names MakeTransport knows, in table order.
std::vector<std::string> KnownTransports();

}  // namespace wb::transport
