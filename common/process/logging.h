// One log format for every weightbeam process (spdlog), level from config or --log-level.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

#include "absl/status/status.h"

namespace wb {

// Sets up the default logger: "2026-11-21 08:00:00.123 I [wb-agent] message" on stderr.
// Returns an error for an unknown level name.
absl::Status InitLogging(const std::string& program, const std::string& level);

}  // namespace wb
