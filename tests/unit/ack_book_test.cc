// The watchers a staged swap waits for (daemon/staging/ack_book.h).
#include "daemon/staging/ack_book.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

using wb::staging::AckBook;
using namespace std::chrono_literals;

TEST_CASE("ack book: nobody asked, nothing to wait for") {
  AckBook book;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(book.Wait(7, 2s).ok());
  CHECK(std::chrono::steady_clock::now() - t0 < 500ms);
  CHECK_FALSE(book.AnySwapper());
}

TEST_CASE("ack book: waits for each watcher's answer to this version") {
  AckBook book;
  book.Enter("engine-a", false);
  book.Enter("engine-b", true);
  CHECK(book.AnySwapper());
  REQUIRE(book.Ack("engine-a", 3, "").ok());
  REQUIRE(book.Ack("engine-b", 2, "").ok());  // an older version does not count
  std::thread late([&] {
    std::this_thread::sleep_for(200ms);
    book.Ack("engine-b", 3, "").IgnoreError();
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(book.Wait(3, 5s).ok());
  CHECK(std::chrono::steady_clock::now() - t0 >= 150ms);
  late.join();
}

TEST_CASE("ack book: a silent watcher times out by name; one that leaves is not waited for") {
  AckBook book;
  book.Enter("answers", false);
  const uint64_t silent = book.Enter("silent", false);
  REQUIRE(book.Ack("answers", 5, "").ok());
  absl::Status s = book.Wait(5, 300ms);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(s.message()), Catch::Contains("silent") && Catch::Contains("300 ms"));
  CHECK_THAT(std::string(s.message()), !Catch::Contains("answers"));
  std::thread leave([&] {
    std::this_thread::sleep_for(100ms);
    book.Leave(silent);
  });
  CHECK(book.Wait(5, 5s).ok());
  leave.join();
}

TEST_CASE("ack book: a failed swap is named; unknown watchers are refused") {
  AckBook book;
  book.Enter("swapper", true);
  REQUIRE(book.Ack("swapper", 9, "out of memory").ok());
  absl::Status s = book.Wait(9, 5s);
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("swapper") && Catch::Contains("out of memory"));
  CHECK(book.Ack("nobody", 9, "").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("an ack counts only from the watcher's own user, and a left watcher's answers go") {
  AckBook book;
  const uint64_t id = book.Enter("engine", false, uid_t{1000});
  const absl::Status other = book.Ack("engine", 4, "", uid_t{1001});
  CHECK(other.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(other.message()), Catch::Contains("another user"));
  // Not counted: the wait still names the watcher.
  CHECK(book.Wait(4, std::chrono::milliseconds(50)).code() == absl::StatusCode::kDeadlineExceeded);
  REQUIRE(book.Ack("engine", 4, "", uid_t{1000}).ok());
  CHECK(book.Wait(4, std::chrono::milliseconds(50)).ok());
  book.Leave(id);
  CHECK(book.Ack("engine", 5, "", uid_t{1000}).code() == absl::StatusCode::kNotFound);
  // Entered again under the same name, it owes version 4 afresh: the old answer went with it.
  book.Enter("engine", false, uid_t{1000});
  CHECK(book.Wait(4, std::chrono::milliseconds(50)).code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("watcher names are scoped per user: a squatter neither hides nor refuses") {
  AckBook book;
  book.Enter("engine", false, uid_t{1001});  // another user took the name first
  const uint64_t mine = book.Enter("engine", false, uid_t{1000});
  REQUIRE(book.Ack("engine", 4, "", uid_t{1000}).ok());  // counts for user 1000's watcher
  CHECK(book.Wait(4, std::chrono::milliseconds(50), {mine}).ok());
  // The squatter's own watcher still owes version 4 (it is only waited for where chosen).
  CHECK(book.Wait(4, std::chrono::milliseconds(50)).code() == absl::StatusCode::kDeadlineExceeded);
  // A third user with no watcher of that name is refused, naming another user's.
  CHECK(book.Ack("engine", 4, "", uid_t{1002}).code() == absl::StatusCode::kPermissionDenied);
}

TEST_CASE("ack book: a wait for chosen watchers ends at Interrupt") {
  AckBook book;
  const uint64_t silent = book.Enter("silent", false, uid_t{1000});
  book.Enter("other-user", false, uid_t{1001});
  std::thread stop([&] {
    std::this_thread::sleep_for(100ms);
    book.Interrupt(6, "the step was aborted");
  });
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = book.Wait(6, 5s, {silent});
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(s.message()), Catch::Contains("aborted"));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  stop.join();
  CHECK(book.Watching().size() == 2);
}

TEST_CASE("ack book: a watcher not listening yet is not listed, so not waited for") {
  AckBook book;
  const uint64_t id = book.Enter("late", false, uid_t{1000}, /*listening=*/false);
  CHECK(book.Watching().empty());
  CHECK(book.Wait(3, std::chrono::milliseconds(50)).ok());
  book.Listening(id);
  REQUIRE(book.Watching().size() == 1);
  CHECK(book.Wait(3, std::chrono::milliseconds(50)).code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("ack book for checks: a watcher that leaves unanswered fails the wait, by name") {
  AckBook::Options options;
  options.failed = "refused";
  options.timeout_setting = "VersionChecks.user_deadline_ms";
  options.leaving_fails = true;
  AckBook book(options);
  const uint64_t gone = book.Enter("smoke", false);
  book.Enter("norms", false);
  REQUIRE(book.Ack("norms", 4, "").ok());
  std::thread leave([&] {
    std::this_thread::sleep_for(100ms);
    book.Leave(gone);
  });
  const absl::Status s = book.Wait(4, 5s);
  leave.join();
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK(std::string(s.message()).find("'smoke' stopped watching before it answered version 4") !=
        std::string::npos);

  const uint64_t slow = book.Enter("slow", false);
  const absl::Status late = book.Wait(5, 100ms, {slow});
  CHECK(late.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(late.message()).find("VersionChecks.user_deadline_ms") != std::string::npos);
  REQUIRE(book.Ack("slow", 6, "loss 9.1").ok());
  const absl::Status refused = book.Wait(6, 1s, {slow});
  CHECK(std::string(refused.message()) == "watcher 'slow' refused version 6: loss 9.1");
}
