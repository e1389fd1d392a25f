// Creates a transport backend by name from the agent's configuration.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "daemon/transport/transport.h"

namespace wb::transport {

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name,
                                                         const config::AgentConfig& config);

}  // namespace wb::transport
