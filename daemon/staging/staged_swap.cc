#include "daemon/staging/staged_swap.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/staging/staging_mirrors.h"

namespace wb::staging {

namespace v1 = weightbeam::v1;

namespace {

const char* PhaseName(StagedSwap::Phase p) {
  switch (p) {
    case StagedSwap::Phase::kIdle:
      return "idle";
    case StagedSwap::Phase::kWaiting:
      return "waiting for its watchers";
    case StagedSwap::Phase::kCopying:
      return "copying into the live tensors";
  }
  return "?";
}

}  // namespace

absl::Status SwapEnvironment::CopyToLive(const registry::RegisteredTensor& t) {
  return CopyStagedToLive(t);
}

absl::Status SwapEnvironment::CopyToStaging(const registry::RegisteredTensor& t) {
  return CopyLiveToStaged(t);
}

StagedSwap::StagedSwap(AckBook* acks, SwapEnvironment env, SwapOptions options)
    : acks_(acks), env_(std::move(env)), options_(std::move(options)) {}

void StagedSwap::Tell(v1::Event::Kind kind, uint64_t version, const std::string& reason) {
  v1::Event e;
  e.set_kind(kind);
  e.set_version(version);
  e.set_reason(reason);
  env_.publish(e);
}

StagedSwap::Audience StagedSwap::Choose(const SwapEnvironment::Tensors& tensors) const {
  Audience who;
  for (const auto& t : tensors) who.owners.insert(t->uid);
  for (const AckBook::Entry& e : acks_->Watching()) {
    if (!who.owners.count(e.owner)) continue;  // writes none of this user's tensors
    who.waited.insert(e.id);
    if (e.swap) who.swapping.insert(e.owner);
  }
  return who;
}

absl::Status StagedSwap::FailLocked(uint64_t version, const std::string& message) {
  // Watchers heard begin(v): they hear abort(v). The live tensors still hold v-1 unless a
  // copy failed part way (then the replica is dropped from the step and serves no version).
  const std::string why =
      absl::StrCat("agent ", options_.agent, ": staged swap of version ", version, ": ", message);
  Tell(v1::Event::KIND_ABORT, version, why);
  told_ = version;
  phase_ = Phase::kIdle;
  version_ = 0;
  moved_.SignalAll();
  // Aborted, never DEADLINE_EXCEEDED: the controller reads that as "no answer".
  return absl::AbortedError(why);
}

absl::Status StagedSwap::Swap(uint64_t version, v1::CommitResponse* resp) {
  const SwapEnvironment::Tensors tensors = env_.destinations();
  // Chosen before anything is told: a watcher that connects later was not told begin(v) and is
  // not waited for (nor does it swap this version: the agent copies its user's tensors).
  const Audience who = Choose(tensors);
  const auto t0 = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    while (phase_ != Phase::kIdle) moved_.Wait(&mu_);  // one swap at a time
    if (version <= told_) {
      return absl::AbortedError(absl::StrCat("agent ", options_.agent, ": staged swap of version ",
                                             version, ": the step was aborted before it began"));
    }
    if (version <= swapped_) {
      return absl::FailedPreconditionError(absl::StrCat("agent ", options_.agent, ": version ",
                                                        version, " is not newer than version ",
                                                        swapped_, " swapped in already"));
    }
    phase_ = Phase::kWaiting;
    version_ = version;
    aborted_ = false;
    // The version about to be replaced, kept for a rollback before anything can overwrite it
    // (a swap watcher copies on ready(v)); failing to keep it costs the rollback, not the swap.
    if (env_.history != nullptr) {
      if (auto s = env_.history->Save(live_, tensors); !s.ok()) {
        spdlog::warn("agent {}: {}", options_.agent, std::string(s.message()));
      }
    }
    // Swap watchers hear ready(v) with their own user's staging objects only; the others
    // hear begin(v) (local::LocalService sends each kind to its own watchers).
    for (const std::optional<uid_t>& owner : who.swapping) {
      v1::Event ready;
      ready.set_kind(v1::Event::KIND_READY);
      ready.set_version(version);
      ready.set_reason(ReadyAudience(owner));
      for (auto& o : env_.staged_objects(owner)) *ready.add_staged() = std::move(o);
      env_.publish(ready);
    }
    Tell(v1::Event::KIND_BEGIN, version, "");
  }
  absl::Status answered = acks_->Wait(version, options_.ack_timeout, who.waited);
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) {
      // Abort told the watchers abort(v) already; the version never goes live.
      phase_ = Phase::kIdle;
      version_ = 0;
      moved_.SignalAll();
      return absl::AbortedError(
          absl::StrCat("agent ", options_.agent, ": staged swap of version ", version,
                       ": the step was aborted while its watchers were waited for"));
    }
    if (!answered.ok()) return FailLocked(version, std::string(answered.message()));
    // From here on an abort of this version waits for the copy and hears "already committed".
    phase_ = Phase::kCopying;
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (options_.test_delay.count() > 0 &&
      (options_.test_delay_version == 0 || options_.test_delay_version == version)) {
    std::this_thread::sleep_for(options_.test_delay);
  }
  absl::Status copied;
  size_t by_agent = 0, by_watchers = 0;
  for (const auto& t : tensors) {
    if (!t->staged) continue;
    if (who.swapping.count(t->uid)) {
      ++by_watchers;  // its user's swap watcher copied it from ready(v)
      continue;
    }
    ++by_agent;
    copied = env_.to_live(*t);
    if (!copied.ok()) break;
  }
  const auto t2 = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  if (!copied.ok()) return FailLocked(version, std::string(copied.message()));
  // Logged before commit(v) is told: a watcher that reads the log after commit(v) finds it.
  spdlog::info(
      "version {}: swapped into the live tensors in {:.3f} s ({} tensor(s) by the agent, {} by "
      "swap watchers)",
      version, std::chrono::duration<double>(t2 - t0).count(), by_agent, by_watchers);
  // commit(v) told before the phase leaves copying: an abort waiting for it then finds v
  // committed, never the other way round.
  absl::Status committed = env_.commit(version);
  phase_ = Phase::kIdle;
  version_ = 0;
  if (committed.ok()) {
    swapped_ = version;
    live_ = version;
    dirty_ = false;
  }
  moved_.SignalAll();
  if (!committed.ok()) return committed;
  // The live tensors were written during the copy; a watcher swapping by itself, from
  // ready(v) until it answered.
  if (resp != nullptr) {
    resp->set_live_write_seconds(
        std::chrono::duration<double>(by_watchers > 0 ? t2 - t0 : t2 - t1).count());
  }
  return absl::OkStatus();
}

StagedSwap::AbortOutcome StagedSwap::Abort(uint64_t version, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  // A copy in progress finishes first: the abort then finds the version committed.
  while (phase_ == Phase::kCopying && version_ == version) moved_.Wait(&mu_);
  if (version != 0 && swapped_ == version) return AbortOutcome::kAlreadyCommitted;
  if (phase_ == Phase::kWaiting && version_ == version) {
    aborted_ = true;
    acks_->Interrupt(version, reason);
    // Told under the lock: the swap, which sees aborted_ before it could copy, tells nothing.
    Tell(v1::Event::KIND_ABORT, version, reason);
    told_ = version;
    return AbortOutcome::kTold;
  }
  if (version != 0 && told_ == version) return AbortOutcome::kTold;  // the failed swap told it
  // No swap of it runs: told here, under the lock, and remembered, so that a swap of it that
  // had not started yet (an announce racing this abort) refuses instead of committing it.
  Tell(v1::Event::KIND_ABORT, version, reason);
  told_ = std::max(told_, version);
  return AbortOutcome::kTold;
}

absl::Status StagedSwap::BeforeStep(uint64_t version) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + absl::FromChrono(options_.unfinished_wait);
  while (phase_ != Phase::kIdle) {
    if (moved_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (phase_ != Phase::kIdle) {
    return absl::FailedPreconditionError(
        absl::StrCat("agent ", options_.agent, ": the staged swap of version ", version_,
                     " is still ", PhaseName(phase_), " after ", options_.unfinished_wait.count(),
                     " ms; refusing version ", version, " until it ends"));
  }
  told_ = 0;  // a retry of an aborted version may commit it
  if (dirty_) {
    // Mirrors a step left unswapped (aborted, withdrawn) are made equal to the live tensors
    // again, so that writes and deltas land on what is live. A user's swap watcher owns what
    // that user's live tensors hold: those mirrors go stale instead (deltas refused until a
    // dense step).
    std::set<std::optional<uid_t>> swapping;
    for (const AckBook::Entry& e : acks_->Watching()) {
      if (e.swap) swapping.insert(e.owner);
    }
    bool stale = false;
    for (const auto& t : env_.destinations()) {
      if (!t->staged) continue;
      if (swapping.count(t->uid)) {
        stale = true;
        continue;
      }
      if (absl::Status s = env_.to_staging(*t); !s.ok()) {
        spdlog::error("agent {}: {}", options_.agent, s.ToString());
        stale = true;
      }
    }
    if (stale) {
      spdlog::warn(
          "agent {}: staging holds bytes of an unswapped version; delta patches are refused "
          "until a dense step",
          options_.agent);
      stale_ = true;
    }
  }
  dirty_ = true;
  return absl::OkStatus();
}

bool StagedSwap::stale() const {
  absl::MutexLock lock(&mu_);
  return stale_;
}

void StagedSwap::ClearStale() {
  absl::MutexLock lock(&mu_);
  stale_ = false;
}

StagedSwap::Phase StagedSwap::phase() const {
  absl::MutexLock lock(&mu_);
  return phase_;
}

absl::Status StagedSwap::Rollback(uint64_t version, uint64_t* from) {
  const SwapEnvironment::Tensors tensors = env_.destinations();
  absl::MutexLock lock(&mu_);
  if (env_.history == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("agent ", options_.agent,
                                                      ": no versions are kept for rollback (set "
                                                      "receive.keep_versions)"));
  }
  if (phase_ != Phase::kIdle) {
    return absl::FailedPreconditionError(absl::StrCat("agent ", options_.agent,
                                                      ": the staged swap of version ", version_,
                                                      " is in progress; roll back after it"));
  }
  *from = live_;
  if (version == live_) return absl::OkStatus();  // live already
  if (auto s = env_.history->Save(live_, tensors); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("agent ", options_.agent, ": ", s.message()));
  }
  if (auto s = env_.history->Restore(version, tensors); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("agent ", options_.agent, ": rollback to version ",
                                               version, ": ", s.message()));
  }
  spdlog::info("agent {}: rolled back from version {} to version {} (kept: {})", options_.agent,
               live_, version, env_.history->KeptText());
  live_ = version;
  dirty_ = true;  // the mirrors hold the newer version: restored from live at the next step
  if (env_.rolled_back) {
    env_.rolled_back(version, absl::StrCat("rollback from version ", *from));
  }
  return absl::OkStatus();
}

uint64_t StagedSwap::live_version() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

}  // namespace wb::staging
