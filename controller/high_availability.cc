#include "controller/high_availability.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace wb::controller {

namespace v1 = weightbeam::v1;
using Clock = std::chrono::steady_clock;

namespace {

absl::Duration Ttl(const config::HaConfig& ha) { return absl::Milliseconds(ha.lease_ttl_ms); }

}  // namespace

std::string AdvertisedAddress(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return listen;
  const std::string host = listen.substr(0, colon);
  if (host != "0.0.0.0" && host != "[::]" && host != "::" && !host.empty()) return listen;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return absl::StrCat(name, listen.substr(colon));
}

HighAvailability::HighAvailability(const config::HaConfig& ha, ControllerCore* core,
                                   std::chrono::milliseconds takeover_wait)
    : ha_(ha),
      core_(core),
      takeover_wait_(takeover_wait),
      election_key_(absl::StrCat("/weightbeam/election/", ha.election)),
      ledger_key_(absl::StrCat("/weightbeam/ledger/", ha.election)),
      members_prefix_(absl::StrCat("/weightbeam/members/", ha.election, "/")),
      // One attempt may not outlast a third of the lease: the keepalive gets retries in time.
      etcd_(etcd::EtcdClientOptions{ha.etcd, std::min(absl::Seconds(2), Ttl(ha) / 3),
                                    ha.etcd_ca_file, ha.etcd_cert_file, ha.etcd_key_file}) {}

HighAvailability::~HighAvailability() { Stop(); }

const char* HighAvailability::Name(State s) {
  switch (s) {
    case State::kLeader:
      return "leader";
    case State::kTakingOver:
      return "taking over";
    case State::kStandby:
      break;
  }
  return "standby";
}

void HighAvailability::SetState(State s) {
  absl::MutexLock lock(&mu_);
  if (state_ == s) return;
  state_ = s;
  since_unix_ms_ = absl::ToUnixMillis(absl::Now());
}

absl::Status HighAvailability::Start() {
  // etcd must answer before this controller claims anything: a wrong URL fails loudly here.
  absl::Status reached;
  for (int attempt = 0; attempt < 10; ++attempt) {
    auto kv = etcd_.Get(election_key_);
    reached = kv.status();
    if (reached.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (!reached.ok()) {
    return absl::UnavailableError(absl::StrCat("ha: etcd (", absl::StrJoin(ha_.etcd, ", "),
                                               ") does not answer: ", reached.message()));
  }
  {
    absl::MutexLock lock(&mu_);
    since_unix_ms_ = absl::ToUnixMillis(absl::Now());
  }
  core_->agent_channels().SetLeaderCheck([this] { return election_ && election_->IsLeader(); });
  core_->SetLedgerSink([this](v1::ControllerLedger ledger) {
    absl::MutexLock lock(&mu_);
    pending_ledger_ = std::move(ledger);  // the latest wins: the writer coalesces
  });
  members_ = std::thread([this] { RunMembers(); });
  writer_ = std::thread([this] { RunLedgerWriter(); });
  election_ = std::make_unique<LeaderElection>(&etcd_, ha_.election, ha_.advertise, Ttl(ha_));
  election_->Start([this](int64_t epoch) { OnElected(epoch); }, [this] { OnLost(); });
  spdlog::info("ha: campaigning in election '{}' as {} (lease {} ms, etcd {})", ha_.election,
               ha_.advertise, ha_.lease_ttl_ms, absl::StrJoin(ha_.etcd, ","));
  return absl::OkStatus();
}

void HighAvailability::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (election_) {
    if (auto s = election_->Resign(); !s.ok()) {
      spdlog::warn("ha: leaving the election: {}", s.ToString());
    }
  }
  SetState(State::kStandby);
  if (takeover_.joinable()) takeover_.join();
  if (members_.joinable()) members_.join();
  if (writer_.joinable()) writer_.join();
}

void HighAvailability::OnElected(int64_t epoch) {
  // On the election's thread, which keeps the lease alive: the takeover runs on its own.
  core_->agent_channels().SetLeaderEpoch(epoch);
  {
    absl::MutexLock lock(&mu_);
    takeover_epoch_ = epoch;
    leader_ = ha_.advertise;
    leader_epoch_ = epoch;
  }
  SetState(State::kTakingOver);
  if (takeover_.joinable()) takeover_.join();
  takeover_ = std::thread([this, epoch] { RunTakeover(epoch); });
}

void HighAvailability::OnLost() {
  SetState(State::kStandby);
  spdlog::warn("ha: {} is no longer the leader: it drives no agent until elected again",
               ha_.advertise);
}

void HighAvailability::RunTakeover(int64_t epoch) {
  const auto t0 = Clock::now();
  v1::ControllerLedger saved;
  auto kv = etcd_.Get(ledger_key_);
  if (!kv.ok()) {
    spdlog::warn("ha: cannot read the ledger ({}): going on without it", kv.status().ToString());
  } else if (kv->has_value() &&
             !google::protobuf::util::JsonStringToMessage((*kv)->value, &saved).ok()) {
    spdlog::error("ha: the ledger at {} does not parse: going on without it", ledger_key_);
    saved.Clear();
  }
  const std::string found = core_->TakeOver(saved, Clock::now() + takeover_wait_);
  absl::MutexLock lock(&mu_);
  if (takeover_epoch_ != epoch || !election_->IsLeader()) return;  // lost meanwhile
  state_ = State::kLeader;
  since_unix_ms_ = absl::ToUnixMillis(absl::Now());
  spdlog::info(
      "ha: {} leads (epoch {}) after a takeover of {:.3f} s: ledger of epoch {}, last committed "
      "version {}; {}",
      ha_.advertise, epoch, std::chrono::duration<double>(Clock::now() - t0).count(), saved.epoch(),
      saved.last_committed_version(), found);
}

void HighAvailability::RefreshLeader() const {
  {
    absl::MutexLock lock(&mu_);
    if (!leader_.empty() && leader_ != ha_.advertise) return;  // a leader that is not us
  }
  // Just deposed, or no leader seen yet: read it now rather than name nobody (or ourselves).
  auto kv = etcd_.Get(election_key_);
  if (!kv.ok()) return;
  absl::MutexLock lock(&mu_);
  leader_ = kv->has_value() ? (*kv)->value : "";
  leader_epoch_ = kv->has_value() ? (*kv)->create_revision : 0;
}

grpc::Status HighAvailability::MayLead() const {
  if (!(election_ && election_->IsLeader())) RefreshLeader();
  absl::MutexLock lock(&mu_);
  if (state_ == State::kLeader && election_ && election_->IsLeader()) return grpc::Status::OK;
  if (state_ == State::kTakingOver) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("wb-controller ", ha_.advertise,
                                     " was just elected and is taking over (epoch ",
                                     takeover_epoch_, "); retry in a moment"));
  }
  const bool known = !leader_.empty() && leader_ != ha_.advertise;
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("wb-controller ", ha_.advertise, " is a standby; ",
                   known ? absl::StrCat("the leader is ", leader_, " (epoch ", leader_epoch_, ")")
                         : std::string("no leader is known right now"),
                   " [wb-leader: ", known ? leader_ : "", "]"));
}

v1::Leadership HighAvailability::Describe() const {
  if (!(election_ && election_->IsLeader())) RefreshLeader();
  v1::Leadership l;
  absl::MutexLock lock(&mu_);
  l.set_enabled(true);
  const bool leading = state_ == State::kLeader && election_ && election_->IsLeader();
  l.set_state(leading ? "leader" : Name(state_ == State::kLeader ? State::kStandby : state_));
  l.set_self(ha_.advertise);
  l.set_leader(leader_);
  l.set_epoch(leader_epoch_);
  l.set_since_unix_ms(since_unix_ms_);
  l.set_election(ha_.election);
  for (const auto& s : standbys_) l.add_standbys(s);
  return l;
}

void HighAvailability::RunMembers() {
  // A member key on a lease of our own (separate from the election's), refreshed every third of
  // the TTL; each round also reads who leads and who else stands by.
  const std::string key = members_prefix_ + ha_.advertise;
  int64_t lease = 0;
  auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  while (true) {
    if (lease == 0 || !etcd_.LeaseKeepAlive(lease, Ttl(ha_) / 2).ok()) {
      auto granted = etcd_.LeaseGrant(Ttl(ha_));
      lease = granted.ok() ? granted->id : 0;
      if (lease != 0) etcd_.Put(key, ha_.advertise, lease).IgnoreError();
    }
    auto members = etcd_.GetPrefix(members_prefix_);
    auto leader = etcd_.Get(election_key_);
    {
      absl::MutexLock lock(&mu_);
      if (leader.ok()) {
        leader_ = leader->has_value() ? (*leader)->value : "";
        leader_epoch_ = leader->has_value() ? (*leader)->create_revision : 0;
      }
      if (members.ok()) {
        standbys_.clear();
        for (const auto& m : *members) {
          if (m.value != leader_) standbys_.push_back(m.value);
        }
      }
      mu_.AwaitWithTimeout(absl::Condition(&stopping), Ttl(ha_) / 3);
      if (stop_) break;
    }
  }
  if (lease != 0) etcd_.LeaseRevoke(lease).IgnoreError();
}

void HighAvailability::RunLedgerWriter() {
  auto wanted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || pending_ledger_.has_value();
  };
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(&wanted));
    if (!pending_ledger_) return;  // stopping, nothing left to write
    v1::ControllerLedger ledger = std::move(*pending_ledger_);
    pending_ledger_.reset();
    mu_.Unlock();
    std::string text;
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;
    const bool printed = google::protobuf::util::MessageToJsonString(ledger, &text, options).ok();
    // Written only while the election key is still ours (its create_revision is our epoch): a
    // deposed leader's late write cannot overwrite the new leader's ledger.
    absl::StatusOr<bool> written = false;
    if (printed && ledger.epoch() > 0) {
      written = etcd_.PutIfGuard(ledger_key_, text, election_key_, ledger.epoch());
    }
    if (!written.ok()) {
      spdlog::warn("ha: writing the ledger failed (retried): {}", written.status().ToString());
      mu_.Lock();
      if (!pending_ledger_) pending_ledger_ = std::move(ledger);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(200));
      if (stop_) return;
      continue;
    } else if (!*written && ledger.epoch() > 0) {
      spdlog::warn(
          "ha: ledger of epoch {} not written: this controller no longer holds the "
          "election",
          ledger.epoch());
    }
    mu_.Lock();
    if (stop_ && !pending_ledger_) return;
  }
}

}  // namespace wb::controller
