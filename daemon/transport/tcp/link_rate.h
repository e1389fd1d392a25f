// The rate the tcp rail reports to the planner (NicInfo.gbps): the configured one
// (`transports.tcp.gbps`), else the link speed the kernel states for the interface that holds
// the advertised address, else a nominal 1 GB/s that says so. A cost model that takes a
// constant for every tcp link cannot tell a 10 Gbit/s host from a 100 Gbit/s one.
#pragma once

#include <string>

namespace wb::transport::tcp {

struct LinkRate {
  double gbps = 1.0;   // GB/s per direction
  std::string source;  // where the figure came from, for the agent's log and `wbctl status`
};

constexpr double kNominalTcpGbps = 1.0;

// configured_gbps > 0 wins. Otherwise `host` (an IP address) is looked up among this machine's
// interfaces (getifaddrs) and `<sysfs_net>/<interface>/speed` (Mbit/s) read; loopback, virtual
// links without a speed and unknown addresses give the nominal rate.
LinkRate TcpLinkRate(double configured_gbps, const std::string& host,
                     const std::string& sysfs_net = "/sys/class/net");

}  // namespace wb::transport::tcp
