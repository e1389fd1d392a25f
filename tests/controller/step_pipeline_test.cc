// The step pipeline on its own (controller/step_pipeline.h): the capture token, the send lock
// and the capture slots, with steps as threads of this process and no agents. Each case is a
// timing of capture steps that real processes produce only by chance.
#include "controller/step_pipeline.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "absl/synchronization/notification.h"

using wb::controller::CaptureTarget;
using wb::controller::StepPipeline;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

CaptureTarget Target(uint32_t slots) {
  CaptureTarget t;
  t.plan_id = 7;
  t.senders = {"trainer-0"};
  t.slots = slots;
  return t;
}

Clock::time_point In(int ms) { return Clock::now() + milliseconds(ms); }

}  // namespace

TEST_CASE("step pipeline: an in-place step holds the send lock; the next is refused") {
  absl::Mutex send_lock;
  StepPipeline p(&send_lock);
  auto first = p.Enter(1, In(1000));
  REQUIRE(first.ok());
  CHECK((*first)->holds_send_lock());
  (*first)->ReleaseToken();
  auto second = p.Enter(2, In(1000));
  REQUIRE_FALSE(second.ok());
  CHECK_THAT(std::string(second.status().message()),
             Catch::Contains("another step or plan is in progress"));
  first->reset();  // the first step is over: every hold given back
  auto third = p.Enter(3, In(1000));
  REQUIRE(third.ok());
  CHECK((*third)->holds_send_lock());
}

TEST_CASE("step pipeline: a step captures behind a send and sends after it") {
  absl::Mutex send_lock;
  StepPipeline p(&send_lock);
  auto sending = p.Enter(1, In(1000));
  REQUIRE(sending.ok());
  uint64_t after = 99;
  auto slot = (*sending)->TakeSlot(Target(2), In(1000), &after);
  REQUIRE(slot.ok());
  CHECK(*slot == 0);
  CHECK(after == 0);
  (*sending)->OpenSend(Target(2));

  auto behind = p.Enter(2, In(1000));
  REQUIRE(behind.ok());
  CHECK_FALSE((*behind)->holds_send_lock());
  CHECK((*behind)->ahead() == 1);
  CHECK((*behind)->behind().plan_id == 7);
  auto second_slot = (*behind)->TakeSlot((*behind)->behind(), In(1000), &after);
  REQUIRE(second_slot.ok());
  CHECK(*second_slot == 1);  // the other slot, at once
  CHECK(p.waiting_to_send() == 1);

  // The step thread that takes the send lock gives it back (absl::Mutex is owned by a thread).
  absl::Notification locked;
  bool lock_ok = false, held = false;
  int waiting_after = -1;
  std::thread send([&] {
    lock_ok = (*behind)->AwaitSendLock(In(5000)).ok();
    locked.Notify();
    held = (*behind)->holds_send_lock();
    waiting_after = p.waiting_to_send();
    behind->reset();
  });
  CHECK_FALSE(locked.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  (*sending)->ReleaseSlot();
  sending->reset();  // version 1's send is over
  CHECK(locked.WaitForNotificationWithTimeout(absl::Seconds(5)));
  send.join();
  CHECK(lock_ok);
  CHECK(held);
  CHECK(waiting_after == 0);
}

TEST_CASE("step pipeline: with one slot, the next capture waits for the send to free it") {
  absl::Mutex send_lock;
  StepPipeline p(&send_lock);
  auto sending = p.Enter(1, In(1000));
  REQUIRE(sending.ok());
  uint64_t after = 0;
  REQUIRE((*sending)->TakeSlot(Target(1), In(1000), &after).ok());
  (*sending)->OpenSend(Target(1));
  auto behind = p.Enter(2, In(5000));
  REQUIRE(behind.ok());
  std::thread free_it([&] {
    std::this_thread::sleep_for(milliseconds(100));
    (*sending)->ReleaseSlot();
  });
  auto slot = (*behind)->TakeSlot(Target(1), In(5000), &after);
  free_it.join();
  REQUIRE(slot.ok());
  CHECK(*slot == 0);
  CHECK(after == 1);  // "captured after step 1's send"
}

TEST_CASE("step pipeline: the deadlines name what was waited for; nothing is left held") {
  absl::Mutex send_lock;
  StepPipeline p(&send_lock);
  auto sending = p.Enter(1, In(1000));
  REQUIRE(sending.ok());
  uint64_t after = 0;
  REQUIRE((*sending)->TakeSlot(Target(1), In(1000), &after).ok());
  (*sending)->OpenSend(Target(1));
  {
    auto behind = p.Enter(2, In(1000));
    REQUIRE(behind.ok());
    auto slot = (*behind)->TakeSlot(Target(1), In(50), &after);
    REQUIRE_FALSE(slot.ok());
    CHECK_THAT(std::string(slot.status().message()),
               Catch::Contains("for the send of version 1 to free a capture slot"));
    // A third step waits for the token while the second holds it.
    auto third = p.Enter(3, In(50));
    REQUIRE_FALSE(third.ok());
    CHECK_THAT(std::string(third.status().message()),
               Catch::Contains("for the step before it to capture"));
  }  // the second step failed: its token and its place in line go back
  CHECK(p.waiting_to_send() == 0);
  auto fourth = p.Enter(4, In(1000));
  REQUIRE(fourth.ok());
  CHECK_FALSE((*fourth)->holds_send_lock());
  // Version 1 still sends: the wait for the send lock ends at the deadline (a step thread of
  // its own: the send lock belongs to version 1's).
  absl::Status lock;
  const auto t0 = Clock::now();
  std::thread wait([&] { lock = (*fourth)->AwaitSendLock(In(50)); });
  wait.join();
  CHECK(Clock::now() - t0 < milliseconds(1000));
  CHECK_FALSE(lock.ok());
  CHECK_THAT(std::string(lock.message()), Catch::Contains("for version 1's send"));
}
