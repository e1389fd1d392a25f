#include "daemon/transport/factory.h"

#include "absl/strings/str_cat.h"

namespace wb::transport {

// Placeholder until the backends land.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name,
                                                         const config::AgentConfig&) {
  return absl::UnimplementedError(absl::StrCat("transport '", name, "' is not built yet"));
}

}  // namespace wb::transport
