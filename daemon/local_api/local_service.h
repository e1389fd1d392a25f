// The Local gRPC service on the agent's Unix socket: a process opens a Session stream, says who
// it is, registers tensors; when the stream ends (exit or crash) its regions are withdrawn.
// WatchEvents streams begin/commit/abort to inference processes.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/local_api/event_bus.h"
#include "daemon/registry/region_registry.h"
#include "daemon/staging/ack_book.h"
#include "weightbeam/v1/local.grpc.pb.h"

namespace wb::local {

class LocalService final : public weightbeam::v1::Local::CallbackService {
 public:
  // `on_refused` (optional) hears every refused registration request, e.g. to count it.
  // `committed_version` (optional) is the version a KIND_SUBSCRIBED event carries.
  LocalService(registry::RegionRegistry* registry, EventBus* events,
               std::function<void(const std::string& why)> on_refused = nullptr,
               std::function<uint64_t()> committed_version = nullptr)
      : registry_(registry),
        events_(events),
        on_refused_(std::move(on_refused)),
        committed_version_(std::move(committed_version)) {}

  grpc::ServerBidiReactor<weightbeam::v1::SessionRequest, weightbeam::v1::SessionResponse>* Session(
      grpc::CallbackServerContext* ctx) override;

  grpc::ServerWriteReactor<weightbeam::v1::Event>* WatchEvents(
      grpc::CallbackServerContext* ctx, const weightbeam::v1::WatchEventsRequest* req) override;

  // Engine layouts (common/engines) for clients that do not link them (Python).
  grpc::ServerUnaryReactor* EngineLayout(grpc::CallbackServerContext* ctx,
                                         const weightbeam::v1::EngineLayoutRequest* req,
                                         weightbeam::v1::EngineLayoutResponse* resp) override;
  grpc::ServerUnaryReactor* SourceLayout(grpc::CallbackServerContext* ctx,
                                         const weightbeam::v1::SourceLayoutRequest* req,
                                         weightbeam::v1::SourceLayoutResponse* resp) override;
  grpc::ServerUnaryReactor* TrainerLayout(grpc::CallbackServerContext* ctx,
                                          const weightbeam::v1::TrainerLayoutRequest* req,
                                          weightbeam::v1::TrainerLayoutResponse* resp) override;

  int active_sessions() const { return active_sessions_.load(); }

  // Kernel credentials of the connection a call arrived on, by the call's peer string (see
  // UnixListener). Without it every memory registration is refused. Set before serving.
  using CredentialLookup = std::function<std::optional<registry::Caller>(const std::string&)>;
  void SetCredentialLookup(CredentialLookup lookup) { credentials_ = std::move(lookup); }

  // Answers a session's PublishVersion (storage path); runs on its own thread, may take long.
  // Without a handler the request is refused. Set before the socket serves.
  using PublishHandler =
      std::function<absl::StatusOr<weightbeam::v1::PublishResult>(uint64_t version)>;
  void SetPublishHandler(PublishHandler handler) { on_publish_ = std::move(handler); }

  // Watchers that acknowledge (WatchEventsRequest.ack / swap) enter `acks`; their
  // SessionRequest.ack answers go there. `staged`: receive.mode staged (a watcher that swaps
  // hears ready(v) instead of begin(v); without it, swap is refused). Set before serving.
  void SetAckBook(staging::AckBook* acks, bool staged) {
    acks_ = acks;
    staged_ = staged;
  }
  // Check watchers (WatchEventsRequest.check, VersionChecks.user) enter `checks`, and their
  // AckVersion{check: true} answers go there. Staged agents only. Set before serving.
  void SetCheckBook(staging::AckBook* checks) { checks_ = checks; }

 private:
  friend class SessionReactor;
  registry::RegionRegistry* registry_;
  EventBus* events_;
  const std::function<void(const std::string& why)> on_refused_;
  PublishHandler on_publish_;
  staging::AckBook* acks_ = nullptr;
  staging::AckBook* checks_ = nullptr;
  bool staged_ = false;
  CredentialLookup credentials_;
  const std::function<uint64_t()> committed_version_;
  std::atomic<uint64_t> next_session_{1};
  std::atomic<int> active_sessions_{0};
};

}  // namespace wb::local
