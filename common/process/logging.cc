#include "common/process/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "absl/strings/str_cat.h"

namespace wb {

absl::Status InitLogging(const std::string& program, const std::string& level) {
  spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log level '", level, "': expected trace, debug, info, warn, error or off"));
  }
  auto logger = spdlog::get(program);
  if (!logger) logger = spdlog::stderr_color_mt(program);
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %L [%n] %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace wb
