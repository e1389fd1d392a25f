// The staged swap's state machine (daemon/staging/staged_swap.h) against an injected
// environment: orderings real processes cannot produce on demand (an abort while the copy
// runs, a watcher connecting between the list and begin(v)) as unit tests.
#include "daemon/staging/staged_swap.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace v1 = weightbeam::v1;
using namespace std::chrono_literals;
using wb::registry::RegisteredTensor;
using wb::staging::AckBook;
using wb::staging::StagedSwap;
using wb::staging::SwapEnvironment;
using wb::staging::SwapOptions;

namespace {

// Host tensors (live and staged bytes of their own), the events told, the committed version.
struct Fake {
  struct Buffers {
    std::vector<uint8_t> live, staged;
  };
  std::vector<std::unique_ptr<Buffers>> buffers;
  SwapEnvironment::Tensors tensors;
  absl::Mutex mu;
  std::vector<v1::Event> events ABSL_GUARDED_BY(mu);
  uint64_t committed ABSL_GUARDED_BY(mu) = 0;
  std::function<void(const v1::Event&)> on_publish;  // runs as an event is told
  std::function<void()> on_copy;                     // runs before each copy to live

  // A staged tensor of user `uid`: live bytes `live`, staged bytes `staged`.
  void Add(const std::string& name, std::optional<uid_t> uid, uint8_t live, uint8_t staged) {
    auto b = std::make_unique<Buffers>();
    b->live.assign(64, live);
    b->staged.assign(64, staged);
    auto t = std::make_shared<RegisteredTensor>();
    t->spec.set_name(name);
    t->uid = uid;
    t->staged = true;
    t->live = {b->live.data(), 64, wb::transport::MemoryKind::kHost, 0};
    t->memory = {b->staged.data(), 64, wb::transport::MemoryKind::kHost, 0};
    tensors.push_back(t);
    buffers.push_back(std::move(b));
  }
  uint8_t Live(size_t i) const { return buffers[i]->live[0]; }
  uint8_t Staged(size_t i) const { return buffers[i]->staged[0]; }

  SwapEnvironment Env() {
    SwapEnvironment env;
    env.destinations = [this] { return tensors; };
    env.publish = [this](const v1::Event& e) {
      {
        absl::MutexLock lock(&mu);
        events.push_back(e);
      }
      if (on_publish) on_publish(e);
    };
    env.commit = [this](uint64_t v) {
      v1::Event e;
      e.set_kind(v1::Event::KIND_COMMIT);
      e.set_version(v);
      absl::MutexLock lock(&mu);
      committed = v;
      events.push_back(e);
      return absl::OkStatus();
    };
    env.staged_objects = [](std::optional<uid_t> owner) {
      v1::StagedObject o;
      o.set_staging_shm_name(owner ? "/mirror-of-" + std::to_string(*owner) : "/mirror");
      return std::vector<v1::StagedObject>{o};
    };
    env.to_live = [this](const RegisteredTensor& t) {
      if (on_copy) on_copy();
      return SwapEnvironment::CopyToLive(t);
    };
    return env;
  }
  std::vector<v1::Event> Events() {
    absl::MutexLock lock(&mu);
    return events;
  }
  // The kinds told for `version`, in order: "B" begin, "R" ready, "C" commit, "A" abort.
  std::string Kinds(uint64_t version) {
    std::string out;
    for (const auto& e : Events()) {
      if (e.version() != version) continue;
      out += e.kind() == v1::Event::KIND_BEGIN    ? "B"
             : e.kind() == v1::Event::KIND_READY  ? "R"
             : e.kind() == v1::Event::KIND_COMMIT ? "C"
                                                  : "A";
    }
    return out;
  }
};

SwapOptions Options(std::chrono::milliseconds ack_timeout = 2000ms) {
  SwapOptions o;
  o.agent = "infer-0";
  o.ack_timeout = ack_timeout;
  o.unfinished_wait = 3000ms;
  return o;
}

}  // namespace

TEST_CASE("staged swap: copies staging into live and tells begin, then commit") {
  Fake f;
  f.Add("a", uid_t{1000}, 1, 2);
  AckBook acks;
  StagedSwap swap(&acks, f.Env(), Options());
  REQUIRE(swap.BeforeStep(2).ok());
  v1::CommitResponse resp;
  REQUIRE(swap.Swap(2, &resp).ok());
  CHECK(f.Live(0) == 2);
  CHECK(f.Kinds(2) == "BC");
  CHECK(swap.phase() == StagedSwap::Phase::kIdle);
  // An abort after its commit is refused: no watcher hears abort(2) after commit(2).
  CHECK(swap.Abort(2, "late") == StagedSwap::AbortOutcome::kAlreadyCommitted);
  CHECK(f.Kinds(2) == "BC");
}

TEST_CASE("staged swap: an abort during the copy waits for it and is answered committed") {
  Fake f;
  f.Add("a", uid_t{1000}, 1, 2);
  AckBook acks;
  absl::Notification copying, release;
  f.on_copy = [&] {
    copying.Notify();
    release.WaitForNotification();
  };
  StagedSwap swap(&acks, f.Env(), Options());
  REQUIRE(swap.BeforeStep(2).ok());
  std::thread swapper([&] { CHECK(swap.Swap(2, nullptr).ok()); });
  copying.WaitForNotification();
  CHECK(swap.phase() == StagedSwap::Phase::kCopying);
  std::atomic<bool> answered{false};
  StagedSwap::AbortOutcome outcome{};
  std::thread aborter([&] {
    outcome = swap.Abort(2, "commit call timed out");
    answered = true;
  });
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(answered);  // the abort waits for the copy
  release.Notify();
  swapper.join();
  aborter.join();
  CHECK(outcome == StagedSwap::AbortOutcome::kAlreadyCommitted);
  CHECK(f.Kinds(2) == "BC");
  CHECK(f.Live(0) == 2);
}

TEST_CASE("staged swap: an abort while waiting for watchers stops it; live stays v-1") {
  Fake f;
  f.Add("a", uid_t{1000}, 1, 2);
  AckBook acks;
  acks.Enter("engine", false, uid_t{1000});  // never answers
  StagedSwap swap(&acks, f.Env(), Options(10000ms));
  REQUIRE(swap.BeforeStep(2).ok());
  absl::Status swapped;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread swapper([&] { swapped = swap.Swap(2, nullptr); });
  while (swap.phase() != StagedSwap::Phase::kWaiting) std::this_thread::sleep_for(1ms);
  CHECK(swap.Abort(2, "step aborted") == StagedSwap::AbortOutcome::kTold);
  swapper.join();
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // the wait ended at the abort
  CHECK(swapped.code() == absl::StatusCode::kAborted);
  CHECK(f.Kinds(2) == "BA");  // one abort(2), never a commit(2)
  CHECK(f.Live(0) == 1);
  // The next step restores the mirror to live (v-1) before its writes land.
  REQUIRE(swap.BeforeStep(3).ok());
  CHECK(f.Staged(0) == 1);
}

TEST_CASE("staged swap: an abort before the swap began refuses that swap") {
  Fake f;
  f.Add("a", uid_t{1000}, 1, 2);
  AckBook acks;
  StagedSwap swap(&acks, f.Env(), Options());
  REQUIRE(swap.BeforeStep(2).ok());
  CHECK(swap.Abort(2, "aborted") == StagedSwap::AbortOutcome::kTold);
  CHECK(swap.Swap(2, nullptr).code() == absl::StatusCode::kAborted);
  CHECK(f.Kinds(2) == "A");
  CHECK(f.Live(0) == 1);
}

TEST_CASE("staged swap: the next step waits for an unfinished swap, or refuses past a bound") {
  Fake f;
  f.Add("a", uid_t{1000}, 1, 2);
  AckBook acks;
  absl::Notification copying, release;
  f.on_copy = [&] {
    copying.Notify();
    release.WaitForNotification();
  };
  SwapOptions o = Options();
  o.unfinished_wait = 200ms;
  StagedSwap swap(&acks, f.Env(), o);
  REQUIRE(swap.BeforeStep(2).ok());
  std::thread swapper([&] { CHECK(swap.Swap(2, nullptr).ok()); });
  copying.WaitForNotification();
  absl::Status refused = swap.BeforeStep(3);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("staged swap of version 2 is still copying"));
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    release.Notify();
  });
  CHECK(swap.BeforeStep(3).ok());  // waited for the copy to end
  later.join();
  swapper.join();
  CHECK(f.Live(0) == 2);
}

TEST_CASE("staged swap: only the tensors' users' watchers are waited for and swap") {
  Fake f;
  f.Add("mine", uid_t{1000}, 1, 2);
  AckBook acks;
  // Another user: a silent ack watcher, a swap watcher, a squatter on "engine".
  acks.Enter("silent", false, uid_t{1001});
  acks.Enter("rogue-swapper", true, uid_t{1001});
  acks.Enter("engine", false, uid_t{1001});
  acks.Enter("engine", false, uid_t{1000});
  f.on_publish = [&](const v1::Event& e) {
    if (e.kind() == v1::Event::KIND_BEGIN) CHECK(acks.Ack("engine", 2, "", uid_t{1000}).ok());
  };
  StagedSwap swap(&acks, f.Env(), Options(3000ms));
  REQUIRE(swap.BeforeStep(2).ok());
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(swap.Swap(2, nullptr).ok());
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);  // nobody of uid 1001 was waited for
  CHECK(f.Live(0) == 2);                              // the agent swapped user 1000's tensor
  CHECK(f.Kinds(2) == "BC");                          // no ready(2): no swap watcher of 1000

  // A swap watcher of the tensor's own user swaps it: the agent leaves it, and ready(v) lists
  // that user's staging objects only.
  Fake g;
  g.Add("mine", uid_t{1000}, 1, 2);
  g.Add("theirs", uid_t{1001}, 5, 6);
  AckBook book;
  book.Enter("swapper", true, uid_t{1000});
  g.on_publish = [&](const v1::Event& e) {
    if (e.kind() == v1::Event::KIND_READY) CHECK(book.Ack("swapper", 2, "", uid_t{1000}).ok());
  };
  StagedSwap swap2(&book, g.Env(), Options(3000ms));
  REQUIRE(swap2.BeforeStep(2).ok());
  REQUIRE(swap2.Swap(2, nullptr).ok());
  CHECK(g.Live(0) == 1);  // left to user 1000's swap watcher
  CHECK(g.Live(1) == 6);  // user 1001's swapped by the agent
  const auto events = g.Events();
  REQUIRE(events.size() == 3);
  CHECK(events[0].kind() == v1::Event::KIND_READY);
  CHECK(events[0].reason() == wb::staging::ReadyAudience(uid_t{1000}));
  REQUIRE(events[0].staged_size() == 1);
  CHECK(events[0].staged(0).staging_shm_name() == "/mirror-of-1000");
}

TEST_CASE("staged swap: a watcher that connects after begin(v) is not waited for") {
  Fake f;
  f.Add("a", uid_t{1000}, 1, 2);
  AckBook acks;
  f.on_publish = [&](const v1::Event& e) {
    // Connects the moment begin(v) is told: it never heard begin(2).
    if (e.kind() == v1::Event::KIND_BEGIN) acks.Enter("late", false, uid_t{1000});
  };
  StagedSwap swap(&acks, f.Env(), Options(1500ms));
  REQUIRE(swap.BeforeStep(2).ok());
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(swap.Swap(2, nullptr).ok());
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK(f.Kinds(2) == "BC");
}

TEST_CASE("staged swap: a failed copy tells abort(v) once and the controller's abort adds none") {
  Fake f;
  f.Add("a", uid_t{1000}, 1, 2);
  AckBook acks;
  SwapEnvironment env = f.Env();
  env.to_live = [](const RegisteredTensor&) {
    return absl::FailedPreconditionError("its memory could not be accessed (SIGBUS)");
  };
  StagedSwap swap(&acks, env, Options());
  REQUIRE(swap.BeforeStep(2).ok());
  absl::Status s = swap.Swap(2, nullptr);
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(s.message()), Catch::Contains("SIGBUS"));
  CHECK(swap.Abort(2, "replica dropped") == StagedSwap::AbortOutcome::kTold);
  CHECK(f.Kinds(2) == "BA");
}
