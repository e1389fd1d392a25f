// StopChildrenOnSignals: a benchmark killed with SIGTERM takes its daemons with it. A helper
// process installs it, starts a child (`sleep`) with Process and is killed; this test, the
// child's subreaper once the helper is gone, then reaps the child and sees SIGTERM end it.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "tests/support/process.h"

namespace {

// Waits up to `timeout` for `pid` (a child of this process) to end; its wait status, or -1.
int Reap(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// Forks a helper that (if `stop_children`) installs the handler, starts `sleep 30` and reports
// its pid on a pipe, then waits to be killed. Returns {helper, sleep}.
std::pair<pid_t, pid_t> StartHelper(bool stop_children) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t helper = fork();
  REQUIRE(helper >= 0);
  if (helper == 0) {
    close(fds[0]);
    if (stop_children) wb::testing::StopChildrenOnSignals();
    auto* child = new wb::testing::Process({"/bin/sleep", "30"});  // never destroyed
    const pid_t pid = child->pid();
    if (write(fds[1], &pid, sizeof(pid)) != sizeof(pid)) _exit(3);
    while (true) pause();
  }
  close(fds[1]);
  pid_t child = -1;
  REQUIRE(read(fds[0], &child, sizeof(child)) == sizeof(child));
  close(fds[0]);
  return {helper, child};
}

}  // namespace

TEST_CASE("a benchmark killed by SIGTERM stops its child processes first") {
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  auto [helper, child] = StartHelper(true);
  REQUIRE(kill(helper, SIGTERM) == 0);
  const int helper_status = Reap(helper, std::chrono::seconds(10));
  REQUIRE(helper_status != -1);
  CHECK(WIFSIGNALED(helper_status));  // it still dies of the signal
  CHECK(WTERMSIG(helper_status) == SIGTERM);
  const int child_status = Reap(child, std::chrono::seconds(10));
  REQUIRE(child_status != -1);
  CHECK(WIFSIGNALED(child_status));
  CHECK(WTERMSIG(child_status) == SIGTERM);
}

TEST_CASE("without it, the child outlives the killed benchmark (what the handler is for)") {
  REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  auto [helper, child] = StartHelper(false);
  REQUIRE(kill(helper, SIGTERM) == 0);
  REQUIRE(Reap(helper, std::chrono::seconds(10)) != -1);
  CHECK(Reap(child, std::chrono::milliseconds(500)) == -1);  // still running
  kill(child, SIGKILL);
  CHECK(Reap(child, std::chrono::seconds(10)) != -1);
}
