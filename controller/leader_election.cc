#include "controller/leader_election.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace wb::controller {
namespace {

absl::Duration OrDefault(absl::Duration d, absl::Duration fallback) {
  return d > absl::ZeroDuration() ? d : fallback;
}

std::chrono::nanoseconds Chrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

}  // namespace

LeaderElection::LeaderElection(etcd::EtcdClient* etcd, std::string election_name,
                               std::string candidate_id, absl::Duration ttl)
    : LeaderElection(etcd, std::move(election_name), std::move(candidate_id),
                     LeaderElectionOptions{ttl}) {}

LeaderElection::LeaderElection(etcd::EtcdClient* etcd, std::string election_name,
                               std::string candidate_id, LeaderElectionOptions options)
    : etcd_(etcd),
      key_(absl::StrCat("/weightbeam/election/", election_name)),
      candidate_id_(std::move(candidate_id)),
      ttl_(options.ttl),
      margin_(OrDefault(options.margin, options.ttl / 4)),
      poll_(OrDefault(options.poll, options.ttl / 6)) {}

LeaderElection::~LeaderElection() { Resign().IgnoreError(); }

void LeaderElection::Start(OnElected on_elected, OnLost on_lost) {
  if (thread_.joinable()) return;
  on_elected_ = std::move(on_elected);
  on_lost_ = std::move(on_lost);
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Run(); });
}

absl::Status LeaderElection::Resign() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  leader_ = false;
  epoch_ = 0;
  if (lease_id_ == 0) return absl::OkStatus();
  const int64_t lease = std::exchange(lease_id_, 0);
  absl::Status revoked = etcd_->LeaseRevoke(lease);
  // NotFound: the lease expired already, which is what revoking wanted.
  return revoked.code() == absl::StatusCode::kNotFound ? absl::OkStatus() : revoked;
}

bool LeaderElection::IsLeader() const { return leader_ && Clock::now() < Deadline(); }

int64_t LeaderElection::Epoch() const { return IsLeader() ? epoch_.load() : 0; }

absl::StatusOr<std::optional<LeaderInfo>> LeaderElection::Leader() const {
  auto kv = etcd_->Get(key_);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<LeaderInfo>();
  return std::optional<LeaderInfo>(LeaderInfo{(*kv)->value, (*kv)->create_revision});
}

bool LeaderElection::Stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

bool LeaderElection::Sleep(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), std::max(d, absl::ZeroDuration()));
  return !stop_;
}

void LeaderElection::Run() {
  while (!Stopping()) {
    if (leader_) {
      LeadRound();
    } else {
      StandbyRound();
    }
  }
}

void LeaderElection::StandbyRound() {
  if (!paused_) {
    auto kv = etcd_->Get(key_);
    if (!kv.ok()) {
      spdlog::warn("election {}: cannot read the leader: {}", key_, kv.status().ToString());
    } else if (!kv->has_value()) {
      Campaign();
      if (leader_) return;
    }
  }
  Sleep(poll_);
}

void LeaderElection::Campaign() {
  // The lease's TTL starts when etcd grants it, after `sent`: a deadline from `sent` is early.
  const Clock::time_point sent = Clock::now();
  auto lease = etcd_->LeaseGrant(ttl_);
  if (!lease.ok()) {
    spdlog::warn("election {}: cannot grant a lease: {}", key_, lease.status().ToString());
    return;
  }
  auto created = etcd_->CreateIfAbsent(key_, candidate_id_, lease->id);
  // Judged by the key's lease, not `created`: a txn retried on another endpoint after a timeout
  // may have succeeded the first time and fail its compare the second.
  if (created.ok() && created->current && created->current->lease == lease->id) {
    BecomeLeader(lease->id, created->current->create_revision, sent + Chrono(lease->ttl - margin_));
    return;
  }
  if (!created.ok()) {
    spdlog::warn("election {}: campaign failed: {}", key_, created.status().ToString());
  }
  // Lost (or unsure): the revoke also deletes the key if an unanswered txn did create it.
  etcd_->LeaseRevoke(lease->id).IgnoreError();
}

void LeaderElection::BecomeLeader(int64_t lease_id, int64_t epoch,
                                  Clock::time_point lease_deadline) {
  lease_id_ = lease_id;
  epoch_ = epoch;
  SetDeadline(lease_deadline);
  leader_ = true;
  spdlog::info("election {}: {} leads, epoch {}", key_, candidate_id_, epoch);
  if (on_elected_) on_elected_(epoch);
}

void LeaderElection::LeadRound() {
  if (Clock::now() >= Deadline()) {
    StepDown("keepalives failed until the lease could expire");
    return;
  }
  absl::Duration next = poll_;  // retry soon after a failure
  if (!paused_) {
    const Clock::time_point sent = Clock::now();
    // Bounded by the deadline so a hung etcd cannot keep this thread past it.
    auto ttl = etcd_->LeaseKeepAlive(lease_id_, absl::FromChrono(Deadline() - sent));
    if (ttl.ok()) {
      SetDeadline(sent + Chrono(*ttl - margin_));
      next = ttl_ / 3;
    } else if (ttl.status().code() == absl::StatusCode::kNotFound) {
      StepDown(ttl.status().ToString());
      return;
    } else {
      spdlog::warn("election {}: keepalive failed: {}", key_, ttl.status().ToString());
    }
  }
  Sleep(std::min(next, absl::FromChrono(Deadline() - Clock::now())));
}

void LeaderElection::StepDown(const std::string& why) {
  leader_ = false;
  epoch_ = 0;
  spdlog::warn("election {}: {} steps down: {}", key_, candidate_id_, why);
  // on_lost first: the revoke below may take a full timeout when etcd is unreachable.
  if (on_lost_) on_lost_();
  const int64_t lease = std::exchange(lease_id_, 0);
  // If the lease is somehow still alive, revoking frees the key now rather than at expiry.
  if (!paused_) etcd_->LeaseRevoke(lease).IgnoreError();
}

}  // namespace wb::controller
