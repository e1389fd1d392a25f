#include "daemon/storage/store_layout.h"

#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/storage/delta_store.h"
#include "daemon/storage/safetensors.h"

namespace wb::storage {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string VersionPrefix(uint64_t version) { return absl::StrFormat("%020u", version); }

std::string ManifestName(uint64_t version, const std::string &writer) {
  return absl::StrCat(VersionPrefix(version), ".", writer, ".json");
}

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

bool SplitVersion(const std::string &name, uint64_t *version, std::string *rest) {
  if (name.size() < 22 || name[20] != '.') return false;
  uint64_t v = 0;
  for (int i = 0; i < 20; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  *version = v;
  *rest = name.substr(21);
  return true;
}

bool EndsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Manifest ReadManifest(const std::string &path, uint64_t version, const std::string &writer) {
  Manifest m;
  m.writer = writer;
  m.version = version;
  auto bytes = ReadWholeFile(path);
  if (!bytes.ok()) {
    m.error = std::string(bytes.status().message());
    return m;
  }
  json j = json::parse(bytes->begin(), bytes->end(), nullptr, false);
  auto bad = [&](const std::string &what) {
    m.error = absl::StrCat(path, ": bad manifest: ", what);
    return m;
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  try {
    if (j.value("format", "") != kStoreFormat) {
      return bad(absl::StrCat("format is not ", kStoreFormat));
    }
    if (j.at("version").get<uint64_t>() != version) return bad("version differs from its name");
    m.base_version = j.at("base_version").get<uint64_t>();
    m.anchor = j.at("kind").get<std::string>() == "anchor";
    for (const auto &f : j.at("files")) {
      FileRef ref{f.at("name").get<std::string>(), f.at("bytes").get<uint64_t>(),
                  f.at("checksum").get<std::string>()};
      if (ref.name.find('/') != std::string::npos) return bad("a file name contains '/'");
      m.files.push_back(std::move(ref));
    }
  } catch (const json::exception &e) {
    return bad(e.what());
  }
  return m;
}

absl::StatusOr<VersionMap> ListVersions(const std::string &dir) {
  VersionMap out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return absl::InternalError(absl::StrCat("listing ", dir, ": ", ec.message()));
    const std::string name = it->path().filename().string();
    uint64_t version = 0;
    std::string rest;
    if (!EndsWith(name, ".json") || !SplitVersion(name, &version, &rest)) continue;
    const std::string writer = rest.substr(0, rest.size() - 5);
    out[version][writer] = ReadManifest(it->path().string(), version, writer);
  }
  return out;
}

}  // namespace wb::storage
