#include "security/call_guard.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc/credentials.h"

namespace wb::security {
namespace {

constexpr char kBearer[] = "Bearer ";

// Compares without an early exit, so the time taken says nothing about where they differ.
bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

// Refusals are logged where they happen too: the caller may not report them.
grpc::Status Refused(const grpc::ServerContextBase& ctx, grpc::StatusCode code,
                     const std::string& message) {
  spdlog::warn("refused a call from {}: {}", ctx.peer(), message);
  return grpc::Status(code, message);
}

std::string Describe(const std::vector<std::string>& names) {
  if (names.empty()) return "the caller presented no verified client certificate";
  return absl::StrCat("the caller's certificate names '", absl::StrJoin(names, "', '"), "'");
}

}  // namespace

absl::StatusOr<CallGuard> CallGuard::FromConfig(const wb::grpcutil::TlsConfig& tls,
                                                const std::string& server) {
  CallGuard g;
  g.server_ = server;
  if (!tls.token_file.empty()) {
    auto token = wb::grpcutil::ReadTokenFile(tls.token_file);
    if (!token.ok()) return token.status();
    g.token_ = *token;
    wb::grpcutil::WarnIfReadableByOthers("tls.token_file", tls.token_file);
  }
  g.checks_identity_ = tls.enabled && !tls.ca_file.empty();
  if (tls.enabled) g.controller_identity_ = tls.controller_identity;
  return g;
}

grpc::Status CallGuard::Admit(const grpc::ServerContextBase& ctx) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return Refused(ctx, grpc::StatusCode::UNAUTHENTICATED,
                   absl::StrCat(server_,
                                " requires a token: send 'authorization: Bearer <token>' "
                                "(wbctl: --token-file or WB_TOKEN_FILE; daemons: "
                                "tls.token_file)"));
  }
  std::string value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer) ||
      !ConstantTimeEqual(value.substr(sizeof(kBearer) - 1), token_)) {
    return Refused(ctx, grpc::StatusCode::UNAUTHENTICATED,
                   absl::StrCat("the token sent to ", server_,
                                " is wrong (it does not match the server's token_file)"));
  }
  return grpc::Status::OK;
}

grpc::Status CallGuard::AdmitIdentity(const grpc::ServerContextBase& ctx,
                                      const std::string& identity,
                                      const std::string& method) const {
  if (auto s = Admit(ctx); !s.ok()) return s;
  if (!checks_identity_) return grpc::Status::OK;
  const auto names = PeerNames(ctx);
  if (std::find(names.begin(), names.end(), identity) != names.end()) return grpc::Status::OK;
  return Refused(
      ctx, grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat(method, " on ", server_, " is for '", identity, "' only; ", Describe(names)));
}

grpc::Status CallGuard::AdmitController(const grpc::ServerContextBase& ctx,
                                        const std::string& method) const {
  if (controller_identity_.empty()) return Admit(ctx);
  if (auto s = Admit(ctx); !s.ok()) return s;
  const auto names = PeerNames(ctx);
  if (std::find(names.begin(), names.end(), controller_identity_) != names.end()) {
    return grpc::Status::OK;
  }
  return Refused(ctx, grpc::StatusCode::PERMISSION_DENIED,
                 absl::StrCat(method, " on ", server_, " is only for the controller ('",
                              controller_identity_, "'); ", Describe(names)));
}

std::vector<std::string> CallGuard::PeerNames(const grpc::ServerContextBase& ctx) {
  std::vector<std::string> names;
  auto auth = ctx.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const auto& v : auth->FindPropertyValues(property)) {
      std::string name(v.data(), v.size());
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  return names;
}

}  // namespace wb::security
