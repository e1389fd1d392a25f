#include "common/grpc/credentials.h"

#include <grpcpp/support/client_interceptor.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace wb::grpcutil {
namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& key, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(key, ": no file given"));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(key, ": cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Adds the token to every call's initial metadata.
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // lives as long as the channel that owns this factory
};

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& key, const std::string& path) {
  auto text = ReadWhole(key, path);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": ", path, " is not a PEM file (no '-----BEGIN' line)"));
  }
  return text;
}

void WarnIfReadableByOthers(const std::string& key, const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 0077) != 0) {
    spdlog::warn("{}: {} is readable by group or others (mode {:04o}); chmod 0600 it", key, path,
                 st.st_mode & 07777);
  }
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  auto text = ReadWhole("tls.token_file", path);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tls.token_file: ", path, " is empty"));
  }
  for (char c : token) {
    // Metadata values must be printable ASCII.
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("tls.token_file: ", path, " holds a character that is not printable ASCII"));
    }
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const grpcutil::TlsConfig& tls) {
  if (!tls.enabled) return grpc::InsecureServerCredentials();
  auto cert = ReadPemFile("tls.cert_file", tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile("tls.key_file", tls.key_file);
  if (!key.ok()) return key.status();
  WarnIfReadableByOthers("tls.key_file", tls.key_file);
  grpc_ssl_client_certificate_request_type request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  std::string roots;
  if (!tls.ca_file.empty()) {
    auto ca = ReadPemFile("tls.ca_file", tls.ca_file);
    if (!ca.ok()) return ca.status();
    roots = *ca;
    request = tls.require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                      : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  grpc::SslServerCredentialsOptions options(request);
  options.pem_root_certs = roots;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

ChannelFactory::ChannelFactory() : credentials_(grpc::InsecureChannelCredentials()) {}

absl::StatusOr<ChannelFactory> ChannelFactory::FromConfig(const grpcutil::TlsConfig& tls) {
  ChannelFactory f;
  if (!tls.token_file.empty()) {
    auto token = ReadTokenFile(tls.token_file);
    if (!token.ok()) return token.status();
    f.token_ = *token;
  }
  if (!tls.enabled) return f;
  grpc::SslCredentialsOptions options;
  if (!tls.ca_file.empty()) {
    auto ca = ReadPemFile("tls.ca_file", tls.ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
  }
  // Our own certificate identifies us to servers that verify clients.
  if (!tls.cert_file.empty() || !tls.key_file.empty()) {
    auto cert = ReadPemFile("tls.cert_file", tls.cert_file);
    if (!cert.ok()) return cert.status();
    auto key = ReadPemFile("tls.key_file", tls.key_file);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  f.credentials_ = grpc::SslCredentials(options);
  f.tls_ = true;
  f.server_name_ = tls.server_name;
  return f;
}

std::shared_ptr<grpc::Channel> ChannelFactory::Create(const std::string& target,
                                                      grpc::ChannelArguments args) const {
  if (tls_ && !server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
  if (token_.empty()) return grpc::CreateCustomChannel(target, credentials_, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(token_));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials_, args,
                                                                 std::move(interceptors));
}

}  // namespace wb::grpcutil
