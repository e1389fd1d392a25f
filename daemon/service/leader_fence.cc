#include "daemon/service/leader_fence.h"

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace wb::service {

grpc::Status LeaderFence::Admit(const grpc::ServerContextBase& ctx, const std::string& method) {
  const auto& md = ctx.client_metadata();
  const auto it = md.find(kLeaderEpochKey);
  if (it == md.end()) return AdmitEpoch(0, method);
  int64_t epoch = 0;
  const std::string text(it->second.data(), it->second.size());
  if (!absl::SimpleAtoi(text, &epoch) || epoch <= 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("agent ", agent_, ": ", method, ": leader epoch '", text,
                                     "' is not a positive number"));
  }
  return AdmitEpoch(epoch, method);
}

grpc::Status LeaderFence::AdmitEpoch(int64_t epoch, const std::string& method) {
  absl::MutexLock lock(&mu_);
  if (epoch <= 0) {
    if (newest_ == 0) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("agent ", agent_, ": ", method,
                                     " carries no leader epoch, and this agent "
                                     "follows leader epoch ",
                                     newest_, ": only the elected controller drives it"));
  }
  if (epoch < newest_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("agent ", agent_, ": ", method, " from leader epoch ", epoch,
                                     " refused: this agent follows the newer leader epoch ",
                                     newest_, " (that controller was deposed; it must step down)"));
  }
  if (epoch > newest_) {
    spdlog::warn("agent {}: following controller leader epoch {} (was {})", agent_, epoch, newest_);
    newest_ = epoch;
  }
  return grpc::Status::OK;
}

int64_t LeaderFence::newest() const {
  absl::MutexLock lock(&mu_);
  return newest_;
}

}  // namespace wb::service
