// Test support: start real daemon processes (fork/exec), find free loopback ports, wait for
// conditions, and stop processes (SIGTERM, or SIGKILL/SIGSTOP for fault tests).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace wb::testing {

class Process {
 public:
  // Starts `argv[0]` with the given arguments; stdout/stderr go to `log_path` if given.
  Process(std::vector<std::string> argv, const std::string& log_path = "");
  ~Process();  // SIGTERM, then SIGKILL after 5 s
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits for exit; returns the exit status (or 128 + signal), or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout);
  bool running();

 private:
  pid_t pid_ = -1;
  int status_ = -1;
};

// For benchmarks run by hand: a SIGTERM, SIGINT or SIGHUP to this process first sends SIGTERM
// (after SIGCONT) to every child Process not yet reaped, then ends this process as the signal
// would have. A killed benchmark leaves no daemons behind (its destructors never run).
void StopChildrenOnSignals();

// A TCP port on 127.0.0.1 that was free a moment ago, drawn below the kernel's ephemeral range
// and reserved against concurrent tests for this process's lifetime.
int FreePort();
// True when something accepts TCP connections on 127.0.0.1:port.
bool PortAccepts(int port);
// Polls `cond` every 20 ms until it holds or `timeout` passes.
bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout);
// A fresh directory under /tmp (short enough for Unix socket paths), removed at exit (its
// *.log files kept in the test's undeclared outputs under `bazel test`).
std::string TempDir(const std::string& prefix);
// Path of a binary in the test's runfiles, e.g. "daemon/wb-agent".
std::string Runfile(const std::string& path);
std::string ReadFile(const std::string& path);

// A finished command: its exit status (-1 on timeout) and everything it printed.
struct Output {
  int code;
  std::string text;
};
// Runs the `wbctl` of the test's runfiles with `args` (60 s at most), its output kept in `dir`.
Output Wbctl(const std::string& dir, std::vector<std::string> args);

}  // namespace wb::testing
