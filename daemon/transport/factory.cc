#include "daemon/transport/factory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/transport/local/local_transport.h"
#include "daemon/transport/rdma/rdma_transport.h"
#include "daemon/transport/tcp/tcp_transport.h"

namespace wb::transport {
namespace {

using Maker = absl::StatusOr<std::unique_ptr<Transport>> (*)(const wb::config::AgentConfig&);

struct Backend {
  const char* name;
  Maker make;
};

// One line per backend.
constexpr Backend kBackends[] = {
    {"tcp", &tcp::MakeTcpTransport},
    {"local", &local::MakeLocalTransport},
    {"rdma", &rdma::MakeRdmaTransport},
};

}  // namespace

std::vector<std::string> KnownTransports() {
  std::vector<std::string> names;
  for (const Backend& backend : kBackends) names.emplace_back(backend.name);
  return names;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const std::string& name,
                                                         const wb::config::AgentConfig& config) {
  for (const Backend& backend : kBackends) {
    if (name == backend.name) return backend.make(config);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown transport '", name, "'; known: ", absl::StrJoin(KnownTransports(), ", ")));
}

}  // namespace wb::transport
