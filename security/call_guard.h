// Server-side admission of gRPC calls: the shared token (constant-time compare) and, with TLS
// client certificates, the caller's certificate names (CN and SANs). Handlers call it first;
// a refused call gets UNAUTHENTICATED (token) or PERMISSION_DENIED (identity) with a message
// that says what was expected and what was seen, never the token itself.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc/tls_config.h"

namespace wb::security {

class CallGuard {
 public:
  CallGuard() = default;  // admits everything
  // `server` names this server in messages ("wb-controller", "agent trainer-node").
  static absl::StatusOr<CallGuard> FromConfig(const wb::grpcutil::TlsConfig& tls,
                                              const std::string& server);

  // The token, when one is configured.
  grpc::Status Admit(const grpc::ServerContextBase& ctx) const;
  // Admit, then (when client certificates are verified) the caller's certificate must carry
  // `identity`; `method` names the call in the message ("Agent.LoadPlan").
  grpc::Status AdmitIdentity(const grpc::ServerContextBase& ctx, const std::string& identity,
                             const std::string& method) const;
  // Admit, then (when a controller identity is configured) the caller must be the controller.
  grpc::Status AdmitController(const grpc::ServerContextBase& ctx, const std::string& method) const;

  // True when callers' certificates are verified, so AdmitIdentity checks something.
  bool checks_identity() const { return checks_identity_; }
  // The CN and SAN entries of the caller's verified certificate (empty without one).
  static std::vector<std::string> PeerNames(const grpc::ServerContextBase& ctx);

 private:
  std::string server_;
  std::string token_;
  bool checks_identity_ = false;
  std::string controller_identity_;
};

// A streaming reply that only reports `status` (for refused server-streaming calls).
template <typename T>
class RefusedWriter : public grpc::ServerWriteReactor<T> {
 public:
  explicit RefusedWriter(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

// The same for refused bidirectional streams: nothing is read, the stream ends with `status`.
template <typename Req, typename Resp>
class RefusedStream : public grpc::ServerBidiReactor<Req, Resp> {
 public:
  explicit RefusedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace wb::security
