// The agent's end of step links (docs/performance.md, "Step links"): a plain TCP listener whose
// connections carry the controller's step commands as sealed frames (common/steplink) instead
// of gRPC stream messages, one send and one receive per command. The controller first asks for
// a link over its admitted gRPC call (Agent.OpenStepLink), which Issue answers with a fresh id
// and key; a connection must present that id and prove that key within the handshake timeout,
// once, or it is closed before anything runs. One thread serves every connection with epoll
// and runs the commands, execute included (step_commands.h, ExecuteOn::kCaller; a send from a
// capture excepted): while an agent sends, its links wait, handshakes of new ones too. Replies are
// sealed and sent by whichever thread finishes the command.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/net/socket_util.h"
#include "weightbeam/v1/agent.pb.h"

namespace wb::service {

struct StepLinkOptions {
  std::string host = "0.0.0.0";  // where to listen
  uint16_t port = 0;             // 0: any free port
  // A connection must present its id and key within this.
  std::chrono::milliseconds handshake_timeout{5000};
  // Links handed out and not yet used (the oldest goes first); a grant also expires after this.
  int max_grants = 64;
  std::chrono::milliseconds grant_lifetime{60000};
  // Connections still in their handshake (a new one beyond this closes the oldest), and open
  // links (a new one beyond this closes the oldest: a restarted controller's old link).
  int max_unauthenticated = 64;
  int max_links = 8;
  // A reply that cannot be written for this long closes its link.
  std::chrono::milliseconds send_timeout{10000};
};

class StepLinkServer {
 public:
  // Runs one command; `reply` takes its one answer, from any thread.
  using Runner = std::function<void(weightbeam::v1::StepCommand,
                                    std::function<void(weightbeam::v1::StepReply)> reply)>;

  // Listens and starts the serving thread; `run` must stay valid until Stop.
  static absl::StatusOr<std::unique_ptr<StepLinkServer>> Start(const StepLinkOptions& options,
                                                               Runner run);
  ~StepLinkServer() { Stop(); }
  StepLinkServer(const StepLinkServer&) = delete;
  StepLinkServer& operator=(const StepLinkServer&) = delete;

  // Closes the listener and every link; replies still to come go nowhere. Idempotent.
  void Stop();

  struct Grant {
    uint16_t port = 0;
    std::string link_id;
    std::string key;
  };
  // A new link's id and key, good for one connection.
  absl::StatusOr<Grant> Issue();

  uint16_t port() const { return port_; }
  // Links that proved their key and are still open.
  int open_links() const;

 private:
  struct Conn;
  StepLinkServer(const StepLinkOptions& options, Runner run, net::UniqueFd listener, uint16_t port,
                 int epoll_fd, int wake_fd);
  void Loop();
  void Accept();
  // Reads what `c` has; false when it must close.
  bool Read(const std::shared_ptr<Conn>& c);
  // The first bytes: id and the sealed empty frame. False to close.
  bool Authenticate(const std::shared_ptr<Conn>& c);
  void Close(Conn* c, const std::string& why);
  void CloseExpiredHandshakes();

  const StepLinkOptions options_;
  const Runner run_;
  net::UniqueFd listener_;
  const uint16_t port_;
  const int epoll_fd_;
  const int wake_fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // The serving thread's connections (it alone adds and removes them).
  std::map<Conn*, std::shared_ptr<Conn>> conns_;
  std::atomic<int> open_links_{0};
  uint64_t next_order_ = 0;  // the loop's

  struct PendingGrant {
    std::string key;
    std::chrono::steady_clock::time_point issued;
  };
  mutable absl::Mutex grants_mu_;
  std::map<std::string, PendingGrant> grants_ ABSL_GUARDED_BY(grants_mu_);  // by link id
};

}  // namespace wb::service
