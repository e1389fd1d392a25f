// gRPC credentials from the `tls` configuration: server credentials (TLS, optionally mutual),
// channels (TLS with our certificate, the CA as root) and the shared call token, sent on every
// call as `authorization: Bearer <token>` metadata. Insecure when TLS is off.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/grpc/tls_config.h"

namespace wb::grpcutil {

// Reads a PEM file named by config key `key` (e.g. "tls.cert_file"); errors name the key, the
// path and the cause.
absl::StatusOr<std::string> ReadPemFile(const std::string& key, const std::string& path);
// Warns (does not fail) when a secret file `key` at `path` is readable by group or others.
void WarnIfReadableByOthers(const std::string& key, const std::string& path);
// Reads the shared token: trimmed of surrounding white space; empty or unreadable is an error.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// TLS server credentials when tls.enabled (client certificates required and verified with
// require_client_cert; requested and verified when only ca_file is set), insecure otherwise.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const grpcutil::TlsConfig& tls);

// Makes channels to gRPC servers with the configured credentials and token.
class ChannelFactory {
 public:
  ChannelFactory();  // insecure, no token
  static absl::StatusOr<ChannelFactory> FromConfig(const grpcutil::TlsConfig& tls);

  std::shared_ptr<grpc::Channel> Create(const std::string& target,
                                        grpc::ChannelArguments args = {}) const;
  // The same credentials expecting `name` in servers' certificates ("" : the host dialled).
  ChannelFactory WithServerName(std::string name) const {
    ChannelFactory f = *this;
    f.server_name_ = std::move(name);
    return f;
  }
  bool tls() const { return tls_; }
  bool has_token() const { return !token_.empty(); }

 private:
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  bool tls_ = false;
  std::string token_;
  std::string server_name_;
};

}  // namespace wb::grpcutil
