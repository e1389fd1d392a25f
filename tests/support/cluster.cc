#include "tests/support/cluster.h"

#include <signal.h>
#include <unistd.h>

#include <fstream>

namespace wb::testing {

Cluster::Cluster(const std::string& bin_dir, ClusterOptions options)
    : bin_dir_(bin_dir), options_(std::move(options)), dir_(TempDir("wb-cluster-")) {
  controller_port_ = FreePort();
  std::ofstream(dir_ + "/controller.yaml")
      << "listen: 127.0.0.1:" << controller_port_ << "\nlog_level: info\n"
      << "heartbeat_timeout_ms: " << options_.heartbeat_timeout_ms << "\n"
      << "step_timeout_ms: 20000\nworld:\n  trainer_ranks: " << options_.trainer_ranks
      << "\n  inference_replicas: " << options_.inference_replicas
      << "\n  inference_ranks_per_replica: " << options_.inference_ranks_per_replica << "\n"
      << options_.extra_controller_yaml;
  controller_ =
      std::make_unique<Process>(std::vector<std::string>{bin_dir_ + "/controller/wb-controller",
                                                         "--config", dir_ + "/controller.yaml"},
                                dir_ + "/controller.log");
  // Calls made before the controller listens fail at once (connection refused): wait for it.
  WaitUntil([&] { return PortAccepts(controller_port_); }, std::chrono::seconds(15));
  for (const auto& name : options_.agents) {
    agent_ports_[name] = FreePort();
    tcp_ports_[name] = FreePort();
    StartAgent(name);
  }
}

void Cluster::StartController() {
  controller_ =
      std::make_unique<Process>(std::vector<std::string>{bin_dir_ + "/controller/wb-controller",
                                                         "--config", dir_ + "/controller.yaml"},
                                dir_ + "/controller.log");
}

void Cluster::RestartController(int sig) {
  controller_->Signal(sig);
  controller_->Wait(std::chrono::seconds(5));
  controller_.reset();
  StartController();
  WaitUntil([&] { return PortAccepts(controller_port_); }, std::chrono::seconds(15));
}

Cluster::~Cluster() {
  agents_.clear();
  controller_.reset();
}

std::string Cluster::controller_address() const {
  return "127.0.0.1:" + std::to_string(controller_port_);
}

std::string Cluster::socket(const std::string& agent) const { return dir_ + "/" + agent + ".sock"; }

int Cluster::tcp_port(const std::string& agent) const { return tcp_ports_.at(agent); }

std::string Cluster::agent_address(const std::string& agent) const {
  return "127.0.0.1:" + std::to_string(agent_ports_.at(agent));
}

bool Cluster::StartAgent(const std::string& name) {
  agents_.erase(name);
  const std::string config = dir_ + "/" + name + ".yaml";
  std::ofstream(config) << "name: " << name << "\nlog_level: info\nlocal_socket: " << socket(name)
                        << "\nlisten: " << agent_address(name)
                        << "\ncontroller: " << controller_address()
                        << "\nheartbeat_interval_ms: 200\ntransports:\n  tcp:\n    listen: "
                           "127.0.0.1:"
                        << tcp_ports_.at(name) << "\n"
                        << options_.transports_yaml << options_.extra_agent_yaml
                        << (options_.agent_yaml.count(name) ? options_.agent_yaml.at(name) : "");
  unlink(socket(name).c_str());
  agents_[name] = std::make_unique<Process>(
      std::vector<std::string>{bin_dir_ + "/daemon/wb-agent", "--config", config},
      dir_ + "/" + name + ".log");
  const std::string sock = socket(name);
  return WaitUntil([&] { return access(sock.c_str(), F_OK) == 0; }, std::chrono::seconds(15));
}

bool Cluster::AddAgent(const std::string& name) {
  if (!agent_ports_.count(name)) agent_ports_[name] = FreePort();
  if (!tcp_ports_.count(name)) tcp_ports_[name] = FreePort();
  return StartAgent(name);
}

bool Cluster::MoveAgent(const std::string& name) {
  agent_ports_[name] = FreePort();
  tcp_ports_[name] = FreePort();
  return StartAgent(name);
}

void Cluster::KillAgent(const std::string& name, int sig) {
  agents_.at(name)->Signal(sig);
  if (sig == SIGKILL) agents_.at(name)->Wait(std::chrono::seconds(5));
}

std::string Cluster::Log(const std::string& name) const {
  return ReadFile(dir_ + "/" + name + ".log");
}

}  // namespace wb::testing
