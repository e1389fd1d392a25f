// A child process speaking the drivers' line protocol on its stdin/stdout (wb-demo, wb-cluster):
// its stderr goes to a log file; closing its stdin (destruction) tells it to exit.
#pragma once

#include <sys/types.h>

#include <cstdio>
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
  // The next line that does not start with "aborted" (abort events are expected in fault
  // scenarios), or "" when the child is gone.
  std::string ReceiveSkippingAborts();

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

// This executable's path (/proc/self/exe), or "".
std::string SelfPath();

}  // namespace wb::demo
