// The storage directory's layout: version and manifest names, reading one writer's manifest and
// listing the versions present. The publisher writes this layout, the subscriber reads it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace wb::storage {

// 16 hex digits: how checksums are written in manifests.
std::string Hex(uint64_t v);

// Parses "<20 digits>.<rest>"; false for names of other shapes.
bool SplitVersion(const std::string &name, uint64_t *version, std::string *rest);

bool EndsWith(const std::string &s, const std::string &suffix);

// One writer's manifest of one version.
struct FileRef {
  std::string name;
  uint64_t bytes = 0;
  std::string checksum;
};
struct Manifest {
  std::string writer;
  uint64_t version = 0;
  uint64_t base_version = 0;
  bool anchor = false;
  std::vector<FileRef> files;
  std::string error;  // why it cannot be used
};

Manifest ReadManifest(const std::string &path, uint64_t version, const std::string &writer);

// version -> writer -> manifest, for every manifest in `dir`.
using VersionMap = std::map<uint64_t, std::map<std::string, Manifest>>;
absl::StatusOr<VersionMap> ListVersions(const std::string &dir);

}  // namespace wb::storage
