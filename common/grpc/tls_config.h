// The `tls` section of both daemons' configuration: TLS material, the optional shared call
// token and the names expected on the other side. Read by config/, used by credentials.h.
#pragma once

#include <string>

namespace wb::grpcutil {

struct TlsConfig {
  bool enabled = false;
  std::string cert_file;
  std::string key_file;
  std::string ca_file;  // verifies peers; with require_client_cert: mutual TLS
  bool require_client_cert = false;
  std::string token_file;  // optional shared token sent as call metadata
  // Agent: the name expected in the controller's certificate when it is not the host dialled
  // (peer agents are always checked against the host dialled). Unused by the controller.
  std::string server_name;
  // Agent only: the name (CN or SAN) in the controller's client certificate; with it, Agent
  // calls other than Health and Handshake are accepted only from that certificate.
  std::string controller_identity;
};

}  // namespace wb::grpcutil
