#include "daemon/transport/tcp/link_rate.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace wb::transport::tcp {
namespace {

bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  return a->sa_family == AF_INET6 &&
         std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
}

// The first local interface that holds one of `host`'s addresses (a literal, or a name whose
// addresses are tried in turn: "localhost" may list ::1 first where IPv6 is off), or "".
std::string InterfaceOf(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addrs = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &addrs) != 0) return "";
  ifaddrs* ifs = nullptr;
  std::string name;
  if (getifaddrs(&ifs) == 0) {
    for (const addrinfo* r = addrs; r != nullptr && name.empty(); r = r->ai_next) {
      for (const ifaddrs* i = ifs; i != nullptr && name.empty(); i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_name != nullptr &&
            SameAddress(r->ai_addr, i->ifa_addr)) {
          name = i->ifa_name;
        }
      }
    }
    freeifaddrs(ifs);
  }
  freeaddrinfo(addrs);
  return name;
}

}  // namespace

LinkRate TcpLinkRate(double configured_gbps, const std::string& host,
                     const std::string& sysfs_net) {
  LinkRate rate;
  if (configured_gbps > 0) {
    rate.gbps = configured_gbps;
    rate.source = "transports.tcp.gbps";
    return rate;
  }
  rate.gbps = kNominalTcpGbps;
  const std::string iface = InterfaceOf(host);
  if (iface.empty()) {
    rate.source =
        absl::StrCat("nominal: no local interface holds ", host, "; set transports.tcp.gbps");
    return rate;
  }
  // The kernel states the negotiated speed of physical links; loopback has none and virtual
  // links report -1 or refuse the read.
  long mbit = -1;
  std::ifstream in(sysfs_net + "/" + iface + "/speed");
  if (!(in >> mbit) || mbit <= 0) {
    rate.source =
        absl::StrCat("nominal: ", iface, " states no link speed; set transports.tcp.gbps");
    return rate;
  }
  rate.gbps = static_cast<double>(mbit) / 8000.0;
  rate.source = absl::StrCat("link speed of ", iface, " (", mbit, " Mbit/s)");
  return rate;
}

}  // namespace wb::transport::tcp
