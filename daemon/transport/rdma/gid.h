// Picks the GID index a RoCE queue pair should use: the first "RoCE v2" entry of the port's GID
// table whose GID is an IPv4-mapped address (::ffff:a.b.c.d), read from sysfs so it can be
// tested against a fake directory tree.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace wb::transport::rdma {

struct GidChoice {
  int index = -1;
  std::string gid;   // as sysfs prints it: "0000:0000:0000:0000:0000:ffff:0a4d:0001"
  std::string ipv4;  // "10.77.0.1"
};

// Scans `sysfs_root`/DEVICE/ports/PORT/gid_attrs/types/N and .../gids/N (sysfs_root is normally
// "/sys/class/infiniband"). NotFound names the device and port when no entry qualifies.
absl::StatusOr<GidChoice> FindRoceV2Ipv4Gid(const std::string& sysfs_root,
                                            const std::string& device, int port);

// "10.77.0.1" when `gid` (sysfs notation) is IPv4-mapped, else empty.
std::string Ipv4FromGid(const std::string& gid);

}  // namespace wb::transport::rdma
