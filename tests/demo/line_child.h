// A child process speaking the drivers' line protocol on its stdin/stdout (wb-demo, wb-cluster):
// its stderr goes to a log file; closing its stdin (destruction) tells it to exit.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace wb::demo {

class LineChild {
 public:
  LineChild(std::vector<std::string> argv, const std::string& log);
  ~LineChild();
  LineChild(const LineChild&) = delete;
  LineChild& operator=(const LineChild&) = delete;

  void Send(const std::string& line);
  // The next line, or "" when the child is gone.
  std::string Receive();
  // The same within `timeout`: nullopt when no whole line came in time (the line's start is
  // kept for the next call).
  std::optional<std::string> ReceiveWithin(std::chrono::milliseconds timeout);
  // The next line that does not start with "aborted" (abort events are expected in fault
  // scenarios), or "" when the child is gone.
  std::string ReceiveSkippingAborts();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  int from_ = -1;      // the child's stdout, read without stdio (poll-able)
  std::string input_;  // read but not yet returned
  bool eof_ = false;
};

// This executable's path (/proc/self/exe), or "".
std::string SelfPath();

}  // namespace wb::demo
