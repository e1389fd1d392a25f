#include "daemon/service/controller_link.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace wb::service {

namespace v1 = weightbeam::v1;

namespace {
void WithDeadline(grpc::ClientContext* ctx, int ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}
}  // namespace

ControllerLink::ControllerLink(std::string address, uint32_t heartbeat_ms,
                               std::function<v1::AgentInfo()> info,
                               std::function<v1::AgentLayout()> layout,
                               const security::ChannelFactory& channels)
    : address_(std::move(address)),
      heartbeat_ms_(heartbeat_ms),
      info_(std::move(info)),
      layout_(std::move(layout)) {
  grpc::ChannelArguments args;
  // Reconnect quickly once the controller is back.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  stub_ = v1::Controller::NewStub(channels.Create(address_, args));
}

ControllerLink::~ControllerLink() { Stop(); }

void ControllerLink::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ControllerLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ControllerLink::LayoutChanged() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

bool ControllerLink::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

bool ControllerLink::Register() {
  grpc::ClientContext ctx;
  WithDeadline(&ctx, 5000);
  v1::RegisterAgentRequest req;
  *req.mutable_agent() = info_();
  *req.mutable_layout() = layout_();
  v1::RegisterAgentResponse resp;
  grpc::Status s = stub_->RegisterAgent(&ctx, req, &resp);
  if (!s.ok()) {
    // Retried with backoff (at most every 5 s); a refusal (token, certificate) shows here.
    spdlog::warn("cannot register with controller {}: {}", address_, s.error_message());
    return false;
  }
  epoch_ = resp.epoch();
  reported_generation_ = req.layout().generation();
  if (resp.heartbeat_interval_ms() > 0) heartbeat_ms_ = resp.heartbeat_interval_ms();
  spdlog::info("registered with controller {} (epoch {}, {} tensors)", address_, epoch_,
               req.layout().tensors_size());
  return true;
}

bool ControllerLink::Heartbeat() {
  v1::AgentLayout layout = layout_();
  grpc::ClientContext ctx;
  WithDeadline(&ctx, std::max<int>(2000, heartbeat_ms_ * 2));
  v1::HeartbeatRequest req;
  req.set_agent(layout.agent());
  req.set_epoch(epoch_);
  req.set_layout_generation(layout.generation());
  v1::HeartbeatResponse resp;
  grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
  if (!s.ok()) {
    spdlog::warn("controller {} unreachable: {}", address_, s.error_message());
    return false;
  }
  if (resp.reregister()) {
    spdlog::info("controller {} asks to register again (it restarted)", address_);
    return false;
  }
  if (resp.send_layout() || layout.generation() != reported_generation_) {
    grpc::ClientContext lctx;
    WithDeadline(&lctx, 5000);
    v1::ReportLayoutRequest lreq;
    *lreq.mutable_layout() = layout;
    v1::ReportLayoutResponse lresp;
    if (!stub_->ReportLayout(&lctx, lreq, &lresp).ok()) return false;
    reported_generation_ = layout.generation();
  }
  return true;
}

void ControllerLink::Run() {
  int backoff_ms = 100;
  while (true) {
    bool registered;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      registered = registered_;
    }
    bool ok = registered ? Heartbeat() : Register();
    int wait_ms;
    {
      absl::MutexLock lock(&mu_);
      registered_ = ok;
      if (ok) {
        backoff_ms = 100;
        wait_ms = heartbeat_ms_;
      } else {
        wait_ms = backoff_ms;
        backoff_ms = std::min(backoff_ms * 2, 5000);
      }
      wake_ = false;
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
      mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Milliseconds(wait_ms));
    }
  }
}

}  // namespace wb::service
