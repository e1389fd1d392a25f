#include "daemon/local_api/local_service.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/engines/engine_layout_proto.h"
#include "common/grpc/status_util.h"

namespace wb::local {

namespace v1 = weightbeam::v1;

namespace {

// A watch refused before it started: finishes with its error.
class RefusedWatch : public grpc::ServerWriteReactor<v1::Event> {
  void OnDone() override { delete this; }
};

}  // namespace

// One process's session: requests are handled one at a time, each answered before the next
// read, so responses need no queue.
class SessionReactor : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  SessionReactor(LocalService* service, uint64_t id, std::string peer)
      : service_(service), id_(id), peer_(std::move(peer)) {
    if (service_->credentials_) {
      if (auto c = service_->credentials_(peer_)) caller_ = *c;
    }
    service_->active_sessions_++;
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    response_.set_request_id(request_.request_id());
    if (request_.body_case() == v1::SessionRequest::kPublish && service_->on_publish_) {
      // Writing a version can take seconds: not on a gRPC callback thread. No read is pending
      // until the answer is written, so the reactor stays alive for the thread.
      std::thread([this] {
        HandlePublish();
        StartWrite(&response_);
      }).detach();
      return;
    }
    Handle();
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    int n = service_->registry_->WithdrawSession(id_);
    if (n > 0 || has_owner_) {
      spdlog::info("session {} ({} pid {}) ended: withdrew {} region(s)", id_,
                   owner_.role() == v1::ROLE_TRAINER ? "trainer" : "inference", owner_.pid(), n);
    }
    service_->active_sessions_--;
    delete this;
  }

 private:
  void Fail(absl::StatusCode code, const std::string& message) {
    response_.set_code(static_cast<int>(code));
    response_.set_message(message);
  }

  void Handle() {
    switch (request_.body_case()) {
      case v1::SessionRequest::kHello:
        if (has_owner_) return Fail(absl::StatusCode::kFailedPrecondition, "hello sent twice");
        if (request_.hello().role() == v1::ROLE_UNSPECIFIED) {
          return Fail(absl::StatusCode::kInvalidArgument,
                      "hello: role must be trainer or inference");
        }
        owner_ = request_.hello();
        // The pid the kernel reports, not the one claimed (logs and errors show it).
        if (caller_.known) owner_.set_pid(static_cast<int32_t>(caller_.pid));
        has_owner_ = true;
        return;
      case v1::SessionRequest::kRegister: {
        if (!has_owner_) {
          return Fail(absl::StatusCode::kFailedPrecondition,
                      "register before hello: say who this process is first");
        }
        // All-or-nothing: on the first failure, undo this request's registrations.
        const bool omit = request_.register_().omit_layouts();
        // Undone by the registrations made here, never by name: another batch of this session
        // may hold a view part of the same name.
        std::vector<uint64_t> done;
        done.reserve(request_.register_().tensors_size());
        // The change callback (layout report, metrics) runs once for the batch, not per tensor.
        registry::RegionRegistry* registry = service_->registry_;
        // The request's tensors share one check of each memory object (registry::Caller::batch).
        static std::atomic<uint64_t> batches{0};
        registry::Caller caller = caller_;
        caller.batch = ++batches;
        for (const auto& reg : request_.register_().tensors()) {
          absl::Status refused;
          uint64_t region = 0;
          if (omit) {
            auto id = registry->RegisterQuiet(id_, owner_, reg, caller, /*notify=*/false);
            if (id.ok()) region = *id;
            refused = id.status();
          } else {
            auto layout = registry->Register(id_, owner_, reg, caller);
            if (layout.ok()) {
              region = layout->region().region_id();
              *response_.add_registered() = *std::move(layout);
            }
            refused = layout.status();
          }
          if (!refused.ok()) {
            registry->UnregisterRegions(id_, done);
            response_.clear_registered();
            spdlog::warn("session {}: registration refused: {}", id_,
                         std::string(refused.message()));
            if (service_->on_refused_) service_->on_refused_(std::string(refused.message()));
            return Fail(refused.code(), std::string(refused.message()));
          }
          done.push_back(region);
        }
        if (omit && !done.empty()) registry->NotifyChanged();
        return;
      }
      case v1::SessionRequest::kUnregister:
        for (const auto& name : request_.unregister().names()) {
          if (auto s = service_->registry_->Unregister(id_, name); !s.ok()) {
            return Fail(s.code(), std::string(s.message()));
          }
        }
        return;
      case v1::SessionRequest::kAck: {
        const v1::AckVersion& ack = request_.ack();
        staging::AckBook* book = ack.check() ? service_->checks_ : service_->acks_;
        if (book == nullptr) {
          return Fail(absl::StatusCode::kFailedPrecondition,
                      ack.check() ? "ack: this agent runs no user checks (receive.mode staged)"
                                  : "ack: this agent takes no acknowledgements");
        }
        const std::optional<uid_t> uid =
            caller_.known ? std::optional<uid_t>(caller_.uid) : std::nullopt;
        if (auto s = book->Ack(ack.watcher(), ack.version(), ack.error(), uid); !s.ok()) {
          return Fail(s.code(), std::string(s.message()));
        }
        return;
      }
      case v1::SessionRequest::kPublish:
        return Fail(absl::StatusCode::kFailedPrecondition,
                    "this agent does not publish to storage (set storage.dir and "
                    "storage.role: publish in its configuration)");
      default:
        return Fail(absl::StatusCode::kInvalidArgument, "empty session request");
    }
  }

  void HandlePublish() {
    if (!has_owner_ || owner_.role() != v1::ROLE_TRAINER) {
      return Fail(absl::StatusCode::kFailedPrecondition,
                  "publish: only a trainer session may publish a version");
    }
    auto result = service_->on_publish_(request_.publish().version());
    if (!result.ok()) {
      spdlog::warn("session {}: publishing version {} failed: {}", id_,
                   request_.publish().version(), std::string(result.status().message()));
      return Fail(result.status().code(), std::string(result.status().message()));
    }
    *response_.mutable_published() = *result;
  }

  LocalService* service_;
  uint64_t id_;
  std::string peer_;
  bool has_owner_ = false;
  registry::Caller caller_;  // from SO_PEERCRED; unknown if the connection was not ours
  v1::Owner owner_;
  v1::SessionRequest request_;
  v1::SessionResponse response_;
};

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* LocalService::Session(
    grpc::CallbackServerContext* ctx) {
  return new SessionReactor(this, next_session_++, ctx->peer());
}

grpc::ServerWriteReactor<v1::Event>* LocalService::WatchEvents(grpc::CallbackServerContext* ctx,
                                                               const v1::WatchEventsRequest* req) {
  const bool acknowledges = req->ack() || req->swap();
  std::string refused;
  if (req->check()) {
    if (acknowledges) {
      refused = "watch with check is a stream of its own: ack and swap go on another one";
    } else if (req->watcher().empty()) {
      refused = "watch with check needs a watcher name (WatchEventsRequest.watcher)";
    } else if (checks_ == nullptr) {
      refused = "watch with check needs receive.mode staged on this agent (it writes in place)";
    }
  } else if (acknowledges && req->watcher().empty()) {
    refused = "watch with ack or swap needs a watcher name (WatchEventsRequest.watcher)";
  } else if (acknowledges && acks_ == nullptr) {
    refused = "this agent takes no acknowledgements";
  } else if (req->swap() && !staged_) {
    refused = "watch with swap needs receive.mode staged on this agent (it writes in place)";
  }
  if (!refused.empty()) {
    auto* reactor = new RefusedWatch();
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, refused));
    return reactor;
  }
  BroadcastWriter<v1::Event>::Options options;
  // Built under the bus lock: a commit that lands meanwhile is either counted in the version
  // or delivered after this event (never lost).
  if (req->send_subscribed()) {
    options.first = [this] {
      v1::Event e;
      e.set_kind(v1::Event::KIND_SUBSCRIBED);
      e.set_version(committed_version_ ? committed_version_() : 0);
      return e;
    };
  }
  std::optional<uid_t> owner;
  if (credentials_) {
    if (auto c = credentials_(ctx->peer()); c && c->known) owner = c->uid;
  }
  // A staged agent announces a version as ready(v) and begin(v) at once: watchers that swap
  // hear the first (the one listing their own user's staging objects), the others the second.
  const bool swap = req->swap();
  const bool check = req->check();
  options.keep = [swap, check, staged = staged_,
                  audience = staging::ReadyAudience(owner)](const v1::Event& e) {
    // A check watcher hears its own user's check(v) only; no other watcher hears any.
    if (check || e.kind() == v1::Event::KIND_CHECK) {
      return check && e.kind() == v1::Event::KIND_CHECK && e.reason() == audience;
    }
    if (e.kind() == v1::Event::KIND_READY) return swap && e.reason() == audience;
    return !(swap && staged && e.kind() == v1::Event::KIND_BEGIN);
  };
  if (check) {
    const uint64_t id = checks_->Enter(req->watcher(), /*swap=*/false, owner, false);
    options.on_done = [checks = checks_, id] { checks->Leave(id); };
    auto* writer = new BroadcastWriter<v1::Event>(events_, std::move(options));
    checks_->Listening(id);
    return writer;
  }
  if (!acknowledges) return new BroadcastWriter<v1::Event>(events_, std::move(options));
  // Entered before its stream subscribes (its end leaves the book) but waited for only once
  // it listens: a swap that told begin(v) before that never waits for it.
  const uint64_t id = acks_->Enter(req->watcher(), swap, owner, /*listening=*/false);
  options.on_done = [acks = acks_, id] { acks->Leave(id); };
  auto* writer = new BroadcastWriter<v1::Event>(events_, std::move(options));
  acks_->Listening(id);
  return writer;
}

namespace {

// Answers a unary call with `answer`'s value or its error.
template <typename Response>
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, absl::StatusOr<Response> answer,
                                 Response* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (answer.ok()) *resp = *std::move(answer);
  reactor->Finish(ToGrpc(answer.status()));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* LocalService::EngineLayout(grpc::CallbackServerContext* ctx,
                                                     const v1::EngineLayoutRequest* req,
                                                     v1::EngineLayoutResponse* resp) {
  return Finish(ctx, engines::AnswerEngineLayout(*req), resp);
}

grpc::ServerUnaryReactor* LocalService::SourceLayout(grpc::CallbackServerContext* ctx,
                                                     const v1::SourceLayoutRequest* req,
                                                     v1::SourceLayoutResponse* resp) {
  return Finish(ctx, engines::AnswerSourceLayout(*req), resp);
}

grpc::ServerUnaryReactor* LocalService::TrainerLayout(grpc::CallbackServerContext* ctx,
                                                      const v1::TrainerLayoutRequest* req,
                                                      v1::TrainerLayoutResponse* resp) {
  return Finish(ctx, engines::AnswerTrainerLayout(*req), resp);
}

}  // namespace wb::local
