// Test support: a controller and agents as real processes on loopback, each with its own
// config file, socket and ports, in a fresh directory. Agents can be killed and restarted.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace wb::testing {

struct ClusterOptions {
  std::vector<std::string> agents = {"trainer-node", "inference-node"};
  int trainer_ranks = 1;
  int inference_replicas = 1;
  int inference_ranks_per_replica = 1;
  int heartbeat_timeout_ms = 1500;
  std::string extra_agent_yaml;  // appended to every agent's file
  // Lines inside every agent's `transports:` block, after tcp's listen line: more `tcp` keys
  // (4 spaces) or other transports (2 spaces), e.g. "    gbps: 2\n  local:\n    enabled: false\n".
  std::string transports_yaml;
  std::map<std::string, std::string> agent_yaml;  // appended to that agent's file (e.g. tls:)
  std::string extra_controller_yaml;              // appended to the controller's file
};

class Cluster {
 public:
  Cluster(const std::string& bin_dir, ClusterOptions options);
  ~Cluster();

  const std::string& dir() const { return dir_; }
  std::string controller_address() const;
  std::string socket(const std::string& agent) const;
  std::string agent_address(const std::string& agent) const;
  int tcp_port(const std::string& agent) const;  // the agent's tcp data-plane listener
  // Starts (or restarts) an agent and waits for its socket.
  bool StartAgent(const std::string& agent);
  // Starts an agent the options did not name (a node added mid-run), on a port of its own.
  bool AddAgent(const std::string& agent);
  // Starts an agent again on new ports (a restart on another address: a new pod IP).
  bool MoveAgent(const std::string& agent);
  Process* agent(const std::string& name) { return agents_.at(name).get(); }
  Process* controller() { return controller_.get(); }
  void KillAgent(const std::string& name, int sig);
  // Kills the controller with `sig` and starts a new one on the same port.
  void RestartController(int sig);
  std::string Log(const std::string& name) const;

 private:
  void StartController();

  std::string bin_dir_;
  ClusterOptions options_;
  std::string dir_;
  int controller_port_;
  std::map<std::string, int> agent_ports_;
  std::map<std::string, int> tcp_ports_;
  std::unique_ptr<Process> controller_;
  std::map<std::string, std::unique_ptr<Process>> agents_;
};

}  // namespace wb::testing
