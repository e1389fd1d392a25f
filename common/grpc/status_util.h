// The one place where absl::Status and grpc::Status are converted into each other.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace wb {

// gRPC carries the message in a header, and a reply whose headers pass the peer's limit (8 KiB
// by default) reaches the caller as "received initial metadata size exceeds limit" instead of
// the error: a long message (a plan's problem list) is cut to its first kMaxStatusMessage bytes.
inline constexpr size_t kMaxStatusMessage = 4096;

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  std::string message(s.message());
  if (message.size() > kMaxStatusMessage) {
    const size_t cut = message.size() - kMaxStatusMessage;
    message.resize(kMaxStatusMessage);
    message += " ... (" + std::to_string(cut) + " more bytes)";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), message);
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace wb
