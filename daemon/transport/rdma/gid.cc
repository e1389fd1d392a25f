#include "daemon/transport/rdma/gid.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace wb::transport::rdma {
namespace {

// Reads the first line; empty when the file is missing or unreadable (sysfs answers EINVAL
// for unused GID table entries).
std::string ReadLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

}  // namespace

std::string Ipv4FromGid(const std::string& gid) {
  std::vector<std::string> groups = absl::StrSplit(gid, ':');
  if (groups.size() != 8) return "";
  for (int i = 0; i < 5; ++i) {
    if (groups[i] != "0000") return "";
  }
  if (groups[5] != "ffff") return "";
  uint32_t hi = 0, lo = 0;
  if (!absl::SimpleHexAtoi(groups[6], &hi) || !absl::SimpleHexAtoi(groups[7], &lo)) return "";
  return absl::StrCat(hi >> 8, ".", hi & 0xff, ".", lo >> 8, ".", lo & 0xff);
}

absl::StatusOr<GidChoice> FindRoceV2Ipv4Gid(const std::string& sysfs_root,
                                            const std::string& device, int port) {
  namespace fs = std::filesystem;
  fs::path port_dir = fs::path(sysfs_root) / device / "ports" / std::to_string(port);
  fs::path types_dir = port_dir / "gid_attrs" / "types";
  std::error_code ec;
  std::vector<int> indices;
  for (const auto& entry : fs::directory_iterator(types_dir, ec)) {
    int index = 0;
    if (absl::SimpleAtoi(entry.path().filename().string(), &index)) indices.push_back(index);
  }
  if (ec) {
    return absl::NotFoundError(absl::StrCat("cannot read the GID table of ", device, " port ", port,
                                            ": ", types_dir.string(), ": ", ec.message()));
  }
  std::sort(indices.begin(), indices.end());
  for (int index : indices) {
    if (ReadLine(types_dir / std::to_string(index)) != "RoCE v2") continue;
    std::string gid = ReadLine(port_dir / "gids" / std::to_string(index));
    std::string ipv4 = Ipv4FromGid(gid);
    if (ipv4.empty()) continue;
    return GidChoice{index, gid, ipv4};
  }
  return absl::NotFoundError(absl::StrCat("no RoCE v2 GID with an IPv4 address on ", device,
                                          " port ", port,
                                          " (is the netdev up with an IPv4 address?)"));
}

}  // namespace wb::transport::rdma
