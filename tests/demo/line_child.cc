#include "tests/demo/line_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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
  from_ = fdopen(out[0], "r");
}

LineChild::~LineChild() {
  if (to_) fclose(to_);
  if (pid_ > 0) {
    for (int i = 0; i < 100 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i) usleep(50000);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (from_) fclose(from_);
}

void LineChild::Send(const std::string& line) {
  std::fprintf(to_, "%s\n", line.c_str());
  std::fflush(to_);
}

std::string LineChild::Receive() {
  char buf[4096];
  if (!std::fgets(buf, sizeof(buf), from_)) return "";
  std::string s(buf);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
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
