// The storage directory's layout: version and manifest names, reading one writer's manifest and
// listing the versions present. The publisher writes this layout, the subscriber reads it.
// Everything here comes from a shared directory anyone with write access may fill, so names and
// manifests are parsed strictly: a name that is not exactly what the publisher writes is ignored
// (and said why), never read as some other version.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wb::storage {

// 16 hex digits: how checksums are written in manifests.
std::string Hex(uint64_t v);

// Digits in a version name: the publisher zero-pads every version to 20 (2^64 - 1 has 20), so
// names sort by version and each version has exactly one spelling.
inline constexpr int kVersionDigits = 20;

// Parses "<20 digits>.<rest>": exactly 20 decimal digits (zero-padded), a value in
// [1, 2^64 - 1], a '.', and a non-empty rest. The error says why a name is not a version name.
absl::Status ParseVersionName(const std::string &name, uint64_t *version, std::string *rest);
// The same, as a yes/no.
bool SplitVersion(const std::string &name, uint64_t *version, std::string *rest);

bool EndsWith(const std::string &s, const std::string &suffix);

// Writer (agent) names appear in file names: letters, digits, '-' and '_' only, so one writer's
// names can never be read as another's.
bool ValidWriterName(const std::string &writer);

// A manifest is small; a bigger file is refused before it is read.
inline constexpr uint64_t kMaxManifestBytes = 16 << 20;

// One writer's manifest of one version.
struct FileRef {
  std::string name;
  uint64_t bytes = 0;
  std::string checksum;  // Hex() of the file's StreamHash
  std::string sha256;    // 64 hex digits; written when the publisher has a storage key
};
struct Manifest {
  std::string writer;
  uint64_t version = 0;
  uint64_t base_version = 0;
  bool anchor = false;
  std::vector<FileRef> files;
  std::string mac;    // "hmac-sha256:<64 hex>" when signed, else empty
  std::string path;   // where it was read from, for errors
  std::string error;  // why it cannot be used
};

// Parses a manifest's bytes (named `path` in errors) that a file name gave `version` and
// `writer`. With a non-empty `key` (DeriveManifestKey), the manifest must carry a MAC under it.
Manifest ParseManifest(const std::string &bytes, const std::string &path, uint64_t version,
                       const std::string &writer, const std::string &key);
Manifest ReadManifest(const std::string &path, uint64_t version, const std::string &writer,
                      const std::string &key);

// version -> writer -> manifest, for every manifest in `dir`. `*.json` names that are not
// manifest names go to `ignored` ("<name>: <why>") when given.
using VersionMap = std::map<uint64_t, std::map<std::string, Manifest>>;
absl::StatusOr<VersionMap> ListVersions(const std::string &dir, const std::string &key,
                                        std::vector<std::string> *ignored = nullptr);

}  // namespace wb::storage
