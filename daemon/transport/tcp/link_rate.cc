#include "daemon/transport/tcp/link_rate.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace wb::transport::tcp {
namespace {

std::string InterfaceOfLiteral(bool is_v4, const in_addr& v4, const in6_addr& v6) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* a = list; a != nullptr && name.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_name == nullptr) continue;
    if (is_v4 && a->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == v4.s_addr) {
      name = a->ifa_name;
    } else if (!is_v4 && a->ifa_addr->sa_family == AF_INET6 &&
               std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6,
                           sizeof(v6)) == 0) {
      name = a->ifa_name;
    }
  }
  freeifaddrs(list);
  return name;
}

// The interface holding `host` (an IPv4 or IPv6 literal), or "" when none does.
std::string InterfaceOf(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = inet_pton(AF_INET, host.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && inet_pton(AF_INET6, host.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) return "";
  return InterfaceOfLiteral(is_v4, v4, v6);
}

// A host name is resolved first: the interface is the first that holds one of its addresses
// ("localhost" may list ::1 before 127.0.0.1 where IPv6 is off).
std::string InterfaceOfHost(const std::string& host) {
  if (std::string name = InterfaceOf(host); !name.empty()) return name;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "";
  std::string name;
  for (addrinfo* r = res; r != nullptr && name.empty(); r = r->ai_next) {
    char literal[INET6_ADDRSTRLEN] = {};
    const void* addr =
        r->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(r->ai_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(r->ai_addr)->sin6_addr);
    if ((r->ai_family == AF_INET || r->ai_family == AF_INET6) &&
        inet_ntop(r->ai_family, addr, literal, sizeof(literal)) != nullptr) {
      name = InterfaceOf(literal);
    }
  }
  freeaddrinfo(res);
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
  const std::string iface = InterfaceOfHost(host);
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
