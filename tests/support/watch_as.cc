// Test helper: a watcher of another local user. Drops to --uid / --gid (the test runs as
// root), connects to an agent's Unix socket and watches its events as watcher --watcher, with
// ack (--ack) or swap (--swap); with --answer it acknowledges every begin(v) / ready(v) it
// hears, else it stays silent. Prints "watching" once the watch is confirmed and runs until
// killed. (The staged-swap tests use it: one user's watcher must not decide for another's.)
#include <grp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/weightbeam/local_session.h"

namespace v1 = weightbeam::v1;

int main(int argc, char** argv) {
  std::string socket, watcher = "watcher";
  long uid = -1, gid = -1;
  bool ack = false, swap = false, answer = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--socket")
      socket = next();
    else if (a == "--uid")
      uid = std::atol(next().c_str());
    else if (a == "--gid")
      gid = std::atol(next().c_str());
    else if (a == "--watcher")
      watcher = next();
    else if (a == "--ack")
      ack = true;
    else if (a == "--swap")
      swap = true;
    else if (a == "--answer")
      answer = true;
  }
  if (gid >= 0 && (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(gid)) != 0)) {
    std::perror("watch_as: setgid");
    return 2;
  }
  if (uid >= 0 && setuid(static_cast<uid_t>(uid)) != 0) {
    std::perror("watch_as: setuid");
    return 2;
  }
  auto session =
      wb::client::LocalSession::Connect(socket, wb::client::Identity{v1::ROLE_INFERENCE, 0, 0});
  if (!session.ok()) {
    std::fprintf(stderr, "watch_as: %s\n", session.status().ToString().c_str());
    return 1;
  }
  if (auto s = session->Watch(wb::client::LocalSession::WatchOptions{ack, swap, watcher});
      !s.ok()) {
    std::fprintf(stderr, "watch_as: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("watching\n");
  std::fflush(stdout);
  while (true) {
    auto e = session->NextEvent(std::chrono::seconds(3600));
    if (!e.ok()) continue;
    std::printf("event %d %llu\n", static_cast<int>(e->kind()),
                static_cast<unsigned long long>(e->version()));
    std::fflush(stdout);
    const bool asks = e->kind() == v1::Event::KIND_BEGIN || e->kind() == v1::Event::KIND_READY;
    if (answer && asks) session->Ack(e->version()).IgnoreError();
  }
}
