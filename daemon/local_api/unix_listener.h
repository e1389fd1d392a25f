// The Local service's Unix socket, accepted by the agent itself rather than by gRPC: each
// connection's credentials come from the kernel (SO_PEERCRED) before the connection is handed
// to the gRPC server, so a registration is judged by who really sent it, never by what the
// process says about itself in its hello.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/registry/region_registry.h"

namespace grpc {
class Server;
}

namespace wb::local {

class UnixListener {
 public:
  // Creates, binds and listens on `path` (the caller sets its mode and owner afterwards).
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(const std::string& path);
  ~UnixListener();  // Stop()

  // Accepts on a thread of its own; each connection goes to `server`, which must outlive Stop().
  void Start(grpc::Server* server);
  void Stop();

  // The credentials of the connection a call arrived on, by the call's peer string ("fd:N",
  // what gRPC names a connection handed to it as a file descriptor); nullopt when unknown.
  std::optional<registry::Caller> Lookup(const std::string& grpc_peer) const;

 private:
  explicit UnixListener(int fd) : fd_(fd) {}
  void AcceptLoop(grpc::Server* server);

  int fd_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  // By file descriptor: a number is reused only after gRPC closed its connection, and the
  // new connection's entry is written before it is handed over.
  std::unordered_map<int, registry::Caller> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wb::local
