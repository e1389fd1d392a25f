#include "tests/support/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace wb::testing {

namespace {

// Children not yet reaped, for StopChildrenOnSignals' handler (which may only read atomics).
// A slot holds a pid or 0; more children than slots are simply not tracked.
constexpr int kTrackedChildren = 1024;
std::atomic<pid_t> g_children[kTrackedChildren];

void Track(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return;
  }
}

void Untrack(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t p = pid;
    if (slot.compare_exchange_strong(p, 0)) return;
  }
}

extern "C" void StopChildrenAndDie(int sig) {
  for (auto& slot : g_children) {
    const pid_t pid = slot.load();
    if (pid <= 0) continue;
    kill(pid, SIGCONT);
    kill(pid, SIGTERM);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void StopChildrenOnSignals() {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) signal(sig, StopChildrenAndDie);
}

Process::Process(std::vector<std::string> argv, const std::string& log_path) {
  pid_ = fork();
  if (pid_ == 0) {
    if (!log_path.empty()) {
      int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  if (pid_ > 0) Track(pid_);
}

Process::~Process() {
  if (pid_ <= 0 || status_ != -1) return;
  kill(pid_, SIGCONT);
  kill(pid_, SIGTERM);
  if (Wait(std::chrono::seconds(5)) == -1) {
    kill(pid_, SIGKILL);
    Wait(std::chrono::seconds(5));
  }
}

void Process::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int Process::Wait(std::chrono::milliseconds timeout) {
  if (status_ != -1) return status_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      Untrack(pid_);
      return status_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool Process::running() { return Wait(std::chrono::milliseconds(0)) == -1; }

namespace {

// The low end of the kernel's ephemeral range: ports the kernel hands to outgoing connections
// (and to bind(port 0)). A daemon's port is drawn below it, so no connection from any process can
// take it between the test picking it and the daemon binding it, or while a killed daemon is down.
int EphemeralLow() {
  int low = 32768, high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low >> high;
  return low;
}

// Holds `port` for this process's lifetime against other tests that run at the same time: an
// abstract Unix socket named after it (gone with the process, nothing left on disk).
bool Reserve(int port) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string name = "wb-test-port-" + std::to_string(port);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] == 0: abstract
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    close(fd);
    return false;
  }
  return true;  // fd stays open on purpose
}

bool TcpBindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as the daemons' listeners do
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

int FreePort() {
  static std::mutex mu;
  static std::mt19937 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  const int low = 10000, high = std::max(low + 1000, EphemeralLow()) - 1;
  std::uniform_int_distribution<int> pick(low, high);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(rng);
    if (TcpBindable(port) && Reserve(port)) return port;
  }
  std::fprintf(stderr, "FreePort: no free port in %d..%d\n", low, high);
  std::abort();
}

bool PortAccepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

namespace {

// Directories made by TempDir, removed when the test process exits normally. Under `bazel test`
// their logs are first copied to the test's undeclared outputs (bazel-testlogs/.../outputs.zip),
// so a failure can still be read after the directory is gone.
std::vector<std::string>& MadeDirs() {
  static auto* dirs = new std::vector<std::string>();
  return *dirs;
}
pid_t made_by = 0;  // a forked child that exits must not remove its parent's directories

void RemoveMadeDirs() {
  namespace fs = std::filesystem;
  if (getpid() != made_by) return;
  const char* outputs = getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  for (const auto& dir : MadeDirs()) {
    std::error_code ec;
    if (outputs) {
      const fs::path keep = fs::path(outputs) / fs::path(dir).filename();
      for (const auto& entry : fs::directory_iterator(dir, ec)) {
        if (!entry.is_regular_file(ec) || entry.path().extension() != ".log") continue;
        fs::create_directories(keep, ec);
        fs::copy_file(entry.path(), keep / entry.path().filename(), ec);
      }
    }
    fs::remove_all(dir, ec);
  }
}

}  // namespace

std::string TempDir(const std::string& prefix) {
  // Under /tmp, not TEST_TMPDIR: Unix socket paths must stay under 108 bytes. WB_TEMP_ROOT (a
  // short directory a harness made and removes, e.g. tests/cluster/cluster.sh) replaces /tmp, so
  // that processes killed before their atexit cleanup leave nothing behind.
  const char* root = getenv("WB_TEMP_ROOT");
  std::string tmpl =
      std::string(root != nullptr && *root != '\0' ? root : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* dir = mkdtemp(buf.data());
  if (!dir) return std::string();
  static std::once_flag registered;
  std::call_once(registered, [] {
    made_by = getpid();
    std::atexit(RemoveMadeDirs);
  });
  MadeDirs().push_back(dir);
  return dir;
}

std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (srcdir && ws) return std::string(srcdir) + "/" + ws + "/" + path;
  return "bazel-bin/" + path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Output Wbctl(const std::string& dir, std::vector<std::string> args) {
  static std::atomic<int> n{0};
  const std::string log = dir + "/wbctl-" + std::to_string(n++) + ".out";
  args.insert(args.begin(), Runfile("client/wbctl"));
  Process p(args, log);
  const int code = p.Wait(std::chrono::seconds(60));
  return {code, ReadFile(log)};
}

}  // namespace wb::testing
