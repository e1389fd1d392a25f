#include "tests/demo/line_child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

namespace wb::demo {

LineChild::LineChild(std::vector<std::string> argv, const std::string& log) {
  int in[2], out[2];
  // Close-on-exec, so later children do not inherit (and hold open) this child's pipes.
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 2);
    close(in[1]);
    close(out[0]);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  to_ = fdopen(in[1], "w");
  from_ = out[0];
}

LineChild::~LineChild() {
  if (to_) fclose(to_);
  if (pid_ > 0) {
    for (int i = 0; i < 100 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i) usleep(50000);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (from_ >= 0) close(from_);
}

void LineChild::Send(const std::string& line) {
  std::fprintf(to_, "%s\n", line.c_str());
  std::fflush(to_);
}

std::string LineChild::Receive() {
  return ReceiveWithin(std::chrono::milliseconds::max()).value_or("");
}

std::optional<std::string> LineChild::ReceiveWithin(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = timeout == std::chrono::milliseconds::max() ? Clock::time_point::max()
                                                                    : Clock::now() + timeout;
  for (;;) {
    if (auto nl = input_.find('\n'); nl != std::string::npos) {
      std::string line = input_.substr(0, nl);
      input_.erase(0, nl + 1);
      return line;
    }
    if (eof_ || from_ < 0) {
      std::string rest;
      rest.swap(input_);
      return rest;  // "" when the child is gone
    }
    int wait_ms = -1;
    if (deadline != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return std::nullopt;
      wait_ms = static_cast<int>(std::min<int64_t>(left, 1000));
    }
    pollfd p{from_, POLLIN, 0};
    const int ready = poll(&p, 1, wait_ms);
    if (ready < 0 && errno != EINTR) {
      eof_ = true;
      continue;
    }
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = read(from_, buf, sizeof(buf));
    if (n > 0) {
      input_.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      eof_ = true;
    }
  }
}

std::string LineChild::ReceiveSkippingAborts() {
  for (;;) {
    std::string s = Receive();
    if (s.rfind("aborted ", 0) != 0) return s;
  }
}

std::string SelfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : "";
}

}  // namespace wb::demo
