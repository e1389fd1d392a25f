#include "client/weightbeam/controller_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc/credentials.h"
#include "common/grpc/message_limits.h"
#include "common/grpc/status_util.h"
#include "weightbeam/v1/controller.grpc.pb.h"

namespace wb::client {

namespace v1 = weightbeam::v1;

namespace {
// How long a call other than a step (whose own timeout bounds it) follows a leader change.
constexpr std::chrono::seconds kFailover{60};
}  // namespace

struct ControllerClient::Impl {
  std::string address;
  bool tls = false;
  std::shared_ptr<v1::Controller::Stub> stub;  // the first controller's (the only one, mostly)
  // With several controllers (high availability, issue 45): each one's stub, and which one
  // answered last. Calls go there; a standby's UNAVAILABLE (or silence) moves them on.
  std::vector<std::string> addresses;
  std::vector<std::shared_ptr<v1::Controller::Stub>> stubs;
  std::mutex mu;
  size_t current = 0;

  std::shared_ptr<v1::Controller::Stub> Leader() {
    std::lock_guard<std::mutex> lock(mu);
    return stubs.empty() ? stub : stubs[current];
  }
  std::string LeaderAddress() {
    std::lock_guard<std::mutex> lock(mu);
    return addresses.empty() ? address : addresses[current];
  }
  // After `s` from the current controller: the leader a standby named, else the next one.
  void MoveOn(const grpc::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    const std::string& text = s.error_message();
    const size_t at = text.find("[wb-leader: ");
    if (at != std::string::npos) {
      const size_t from = at + 12;
      const std::string named = text.substr(from, text.find(']', from) - from);
      auto it = std::find(addresses.begin(), addresses.end(), named);
      if (it != addresses.end()) {
        current = static_cast<size_t>(it - addresses.begin());
        return;
      }
    }
    current = (current + 1) % std::max<size_t>(1, addresses.size());
  }
  // Runs `attempt(stub, retry)` on the leader; with several controllers an UNAVAILABLE answer
  // is tried on the next one (`retry` true from the second attempt on) until `until`.
  template <typename Attempt>
  grpc::Status FollowLeader(Attempt attempt, std::chrono::steady_clock::time_point until) {
    for (size_t tried = 0;; ++tried) {
      grpc::Status s = attempt(Leader().get(), tried > 0);
      if (s.ok() || addresses.size() < 2 || s.error_code() != grpc::StatusCode::UNAVAILABLE ||
          std::chrono::steady_clock::now() >= until) {
        return s;
      }
      MoveOn(s);
      // A whole round without a leader: the election is still running.
      if ((tried + 1) % addresses.size() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  }

  // gRPC's own text for a dead server is noisy; say it plainly.
  absl::Status Convert(const grpc::Status& s) const {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      // A TLS mismatch looks like a dead server from here: say what to check.
      return absl::UnavailableError(absl::StrCat(
          "controller at ", address, " is unreachable (", s.error_message(), ")",
          tls ? "; if it is up, check that its certificate is signed by the CA given (--ca / "
                "WB_TLS_CA) and names the host, and that our certificate is accepted"
              : "; if it is up and uses TLS, give --ca (and --cert/--key) or WB_TLS_CA"));
    }
    return FromGrpc(s);
  }
};

absl::StatusOr<v1::StepResult> ControllerClient::Rollback(uint64_t to,
                                                          const std::vector<int32_t>& replicas) {
  v1::RollbackRequest req;
  req.set_to(to);
  for (int32_t k : replicas) req.add_replicas(k);
  v1::RollbackResponse resp;
  grpc::Status s = impl_->FollowLeader(
      [&](v1::Controller::Stub* stub, bool) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
        return stub->Rollback(&ctx, req, &resp);
      },
      std::chrono::steady_clock::now() + kFailover);
  if (!s.ok()) return impl_->Convert(s);
  if (!resp.result().ok()) return absl::AbortedError(resp.result().error());
  return resp.result();
}

namespace {
std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

ControllerClient::Security ControllerClient::Security::FromEnvironment() {
  Security s;
  s.ca_file = Env("WB_TLS_CA");
  s.cert_file = Env("WB_TLS_CERT");
  s.key_file = Env("WB_TLS_KEY");
  s.token_file = Env("WB_TOKEN_FILE");
  s.server_name = Env("WB_TLS_SERVER_NAME");
  return s;
}

ControllerClient::ControllerClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ControllerClient::ControllerClient(ControllerClient&&) noexcept = default;
ControllerClient& ControllerClient::operator=(ControllerClient&&) noexcept = default;
ControllerClient::~ControllerClient() = default;

absl::StatusOr<ControllerClient> ControllerClient::Connect(const std::string& address) {
  return Connect(address, Security::FromEnvironment());
}

absl::StatusOr<ControllerClient> ControllerClient::Connect(const std::string& address,
                                                           const Security& security) {
  if (address.empty()) return absl::InvalidArgumentError("no controller address given");
  if (security.cert_file.empty() != security.key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs both a certificate and a key file (--cert and --key)");
  }
  wb::grpcutil::TlsConfig tls;
  tls.enabled = !security.ca_file.empty() || !security.cert_file.empty();
  tls.ca_file = security.ca_file;
  tls.cert_file = security.cert_file;
  tls.key_file = security.key_file;
  tls.token_file = security.token_file;
  tls.server_name = security.server_name;
  auto channels = wb::grpcutil::ChannelFactory::FromConfig(tls);
  if (!channels.ok()) return channels.status();
  auto impl = std::make_unique<Impl>();
  impl->address = address;
  impl->tls = tls.enabled;
  for (absl::string_view part : absl::StrSplit(address, ',')) {
    std::string a(absl::StripAsciiWhitespace(part));
    if (!a.empty()) impl->addresses.push_back(std::move(a));
  }
  if (impl->addresses.empty()) return absl::InvalidArgumentError("no controller address given");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxControlMessageBytes);  // ListTensors of 10^6 tensors
  if (impl->addresses.size() > 1) {
    // Pings find a controller that stopped answering (frozen, its host gone) in seconds.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  for (const auto& a : impl->addresses) {
    impl->stubs.push_back(v1::Controller::NewStub(channels->Create(a, args)));
  }
  impl->stub = impl->stubs.front();
  if (impl->addresses.size() == 1) impl->stubs.clear();  // one controller: no following
  if (impl->addresses.size() == 1) impl->addresses.clear();
  return ControllerClient(std::move(impl));
}

absl::StatusOr<v1::PlanSummary> ControllerClient::Plan(const v1::ExpectedWorld& world,
                                                       std::chrono::milliseconds wait,
                                                       v1::DeltaChoice delta,
                                                       v1::RelayChoice relays,
                                                       const v1::VersionChecks& checks) {
  v1::PlanRequest req;
  *req.mutable_world() = world;
  req.set_wait_ms(static_cast<uint32_t>(wait.count()));
  req.set_delta(delta);
  req.set_relays(relays);
  *req.mutable_checks() = checks;
  v1::PlanResponse resp;
  grpc::Status s = impl_->FollowLeader(
      [&](v1::Controller::Stub* stub, bool) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(60));
        return stub->Plan(&ctx, req, &resp);
      },
      std::chrono::steady_clock::now() + kFailover);
  if (!s.ok()) return impl_->Convert(s);
  return resp.summary();
}

absl::StatusOr<v1::StepResult> ControllerClient::Step(uint64_t version,
                                                      std::chrono::milliseconds timeout,
                                                      std::optional<uint32_t> max_staleness,
                                                      const std::vector<std::string>& changed) {
  // The controller enforces `timeout`; this deadline only guards against a controller that
  // stalls. Its slack covers a re-plan inside the step and the abort round.
  const auto backstop = timeout.count() > 0 ? timeout + std::chrono::seconds(60)
                                            : std::chrono::milliseconds(std::chrono::minutes(15));
  v1::StepRequest req;
  req.set_version(version);
  req.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
  if (max_staleness) req.set_max_staleness(*max_staleness);
  for (const auto& c : changed) req.add_changed(c);
  v1::StepResponse resp;
  // Failing over retries the step on the new leader within its own timeout; a retry may find
  // the version committed already (the answer says so: it is never committed twice).
  grpc::Status s = impl_->FollowLeader(
      [&](v1::Controller::Stub* stub, bool retry) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + backstop);
        req.set_retry(retry);
        return stub->Step(&ctx, req, &resp);
      },
      std::chrono::steady_clock::now() + (timeout.count() > 0 ? timeout : kFailover));
  if (!s.ok()) return impl_->Convert(s);
  if (!resp.result().ok()) {
    return absl::AbortedError(absl::StrCat("step ", version, " failed: ", resp.result().error()));
  }
  return resp.result();
}

namespace {
constexpr std::chrono::milliseconds kLongestWait = std::chrono::hours(24 * 365);
}  // namespace

// One StepAsync call: its reader thread fills in what came, the handle waits for it.
struct ControllerClient::StepHandle::State {
  uint64_t version = 0;
  std::shared_ptr<ControllerClient::Impl> impl;  // the controllers, to follow the leader
  std::unique_ptr<grpc::ClientContext> ctx;      // the call in flight (a retry makes a new one)
  bool cancelled = false;                        // the handle went: no retry
  std::thread reader;
  std::mutex mu;
  std::condition_variable changed;
  std::optional<v1::StepCaptured> captured;
  std::optional<v1::StepResult> result;
  std::optional<absl::Status> ended;  // the call ended without a result: why

  absl::Status Failed(const v1::StepResult& r) const {
    return absl::AbortedError(absl::StrCat("step ", version, " failed: ", r.error()));
  }
};

ControllerClient::StepHandle::StepHandle() = default;
ControllerClient::StepHandle::StepHandle(StepHandle&&) noexcept = default;
ControllerClient::StepHandle& ControllerClient::StepHandle::operator=(StepHandle&& other) noexcept {
  if (this != &other) {
    StepHandle gone(std::move(*this));  // cancels and joins the one held until now
    state_ = std::move(other.state_);
  }
  return *this;
}

ControllerClient::StepHandle::~StepHandle() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->cancelled = true;
    if (state_->ctx) state_->ctx->TryCancel();  // a no-op once the stream has ended
  }
  if (state_->reader.joinable()) state_->reader.join();
}

absl::StatusOr<v1::StepCaptured> ControllerClient::StepHandle::WaitCaptured(
    std::chrono::milliseconds timeout) {
  if (!state_) return absl::FailedPreconditionError("a moved-from StepHandle");
  timeout = std::min(timeout, kLongestWait);  // milliseconds::max() would overflow the clock
  State& st = *state_;
  std::unique_lock<std::mutex> lock(st.mu);
  if (!st.changed.wait_for(lock, timeout, [&] { return st.captured || st.result || st.ended; })) {
    return absl::DeadlineExceededError(absl::StrCat(
        "step ", st.version, ": the senders had not all captured within ", timeout.count(), " ms"));
  }
  if (st.captured) return *st.captured;
  if (st.result) {
    if (!st.result->ok()) return st.Failed(*st.result);
    v1::StepCaptured c;  // an answer without the captured message (an older controller)
    c.set_version(st.version);
    c.set_seconds(st.result->trainer_stall_seconds());
    c.set_how(st.result->capture());
    return c;
  }
  return *st.ended;
}

absl::StatusOr<v1::StepResult> ControllerClient::StepHandle::Result(
    std::chrono::milliseconds timeout) {
  if (!state_) return absl::FailedPreconditionError("a moved-from StepHandle");
  timeout = std::min(timeout, kLongestWait);  // milliseconds::max() would overflow the clock
  State& st = *state_;
  std::unique_lock<std::mutex> lock(st.mu);
  if (!st.changed.wait_for(lock, timeout, [&] { return st.result || st.ended; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("step ", st.version, ": no result within ", timeout.count(), " ms"));
  }
  if (st.result) {
    if (!st.result->ok()) return st.Failed(*st.result);
    return *st.result;
  }
  return *st.ended;
}

ControllerClient::StepHandle ControllerClient::StepAsync(uint64_t version,
                                                         std::chrono::milliseconds timeout,
                                                         std::optional<uint32_t> max_staleness) {
  StepHandle handle;
  handle.state_ = std::make_shared<StepHandle::State>();
  StepHandle::State* st = handle.state_.get();
  st->version = version;
  if (impl_->addresses.size() > 1) Status().IgnoreError();  // points calls at the leader
  st->impl = impl_;
  // As Step: the controller enforces `timeout`; this only guards against one that stalls.
  const auto backstop = timeout.count() > 0 ? timeout + std::chrono::seconds(60)
                                            : std::chrono::milliseconds(std::chrono::minutes(15));
  const auto deadline = std::chrono::system_clock::now() + backstop;
  // Failing over (several controllers) goes on within the step's timeout.
  const auto until = std::chrono::steady_clock::now() + (timeout.count() > 0 ? timeout : kFailover);
  v1::StepRequest req;
  req.set_version(version);
  req.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
  if (max_staleness) req.set_max_staleness(*max_staleness);
  st->reader = std::thread([st, req, deadline, until]() mutable {
    Impl& impl = *st->impl;
    for (bool retry = false;; retry = true) {
      grpc::ClientContext* ctx;
      {
        std::lock_guard<std::mutex> lock(st->mu);
        if (st->cancelled) {
          st->ended = absl::CancelledError(absl::StrCat("step ", st->version, ": cancelled"));
          break;
        }
        st->ctx = std::make_unique<grpc::ClientContext>();
        st->ctx->set_deadline(deadline);
        ctx = st->ctx.get();
      }
      req.set_retry(retry);
      const std::string address = impl.LeaderAddress();
      auto reader = impl.Leader()->StepAsync(ctx, req);
      v1::StepProgress p;
      while (reader->Read(&p)) {
        std::lock_guard<std::mutex> lock(st->mu);
        if (p.has_captured()) st->captured = p.captured();
        if (p.has_result()) st->result = p.result();
        st->changed.notify_all();
      }
      const grpc::Status s = reader->Finish();
      std::unique_lock<std::mutex> lock(st->mu);
      // Before the capture the trainer has not moved on: the new leader can take the step.
      const bool again = impl.addresses.size() > 1 && !st->captured && !st->result &&
                         !st->cancelled && s.error_code() == grpc::StatusCode::UNAVAILABLE &&
                         std::chrono::steady_clock::now() < until;
      if (again) {
        lock.unlock();
        impl.MoveOn(s);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      if (!st->result) {
        Impl converter{address, impl.tls, nullptr};
        st->ended = s.ok() ? absl::UnavailableError(absl::StrCat("step ", st->version,
                                                                 ": the controller ended the call "
                                                                 "without a result"))
                           : converter.Convert(s);
      }
      st->changed.notify_all();
      break;
    }
  });
  return handle;
}

absl::StatusOr<v1::StatusResponse> ControllerClient::Status() {
  auto ask = [](v1::Controller::Stub* stub, v1::StatusResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->Status(&ctx, v1::StatusRequest(), resp);
  };
  if (impl_->addresses.size() < 2) {
    v1::StatusResponse resp;
    grpc::Status s = ask(impl_->stub.get(), &resp);
    if (!s.ok()) return impl_->Convert(s);
    return resp;
  }
  // Several controllers: the leader's answer, else the first that answered (a standby's).
  std::optional<v1::StatusResponse> any;
  grpc::Status last;
  for (size_t i = 0; i < impl_->addresses.size(); ++i) {
    v1::StatusResponse resp;
    last = ask(impl_->stubs[i].get(), &resp);
    if (!last.ok()) continue;
    if (!resp.leadership().enabled() || resp.leadership().state() == "leader") {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->current = i;
      return resp;
    }
    if (!any) any = std::move(resp);
  }
  if (any) return *any;
  return impl_->Convert(last);
}

std::string ControllerClient::leader() const { return impl_->LeaderAddress(); }

absl::StatusOr<v1::ListTensorsResponse> ControllerClient::ListTensors(const std::string& agent) {
  grpc::ClientContext ctx;
  // 10^6 tensors are ~150 MB on the wire: seconds on a busy machine.
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::ListTensorsRequest req;
  req.set_agent(agent);
  v1::ListTensorsResponse resp;
  grpc::Status s = impl_->Leader()->ListTensors(&ctx, req, &resp);
  if (!s.ok()) return impl_->Convert(s);
  return resp;
}

absl::Status ControllerClient::WatchSteps(
    const std::function<bool(const v1::StepResult&)>& on_step) {
  grpc::ClientContext ctx;
  auto reader = impl_->Leader()->WatchSteps(&ctx, v1::WatchStepsRequest());
  v1::StepResult r;
  while (reader->Read(&r)) {
    if (!on_step(r)) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return s.ok() ? absl::OkStatus() : impl_->Convert(s);
}

}  // namespace wb::client
