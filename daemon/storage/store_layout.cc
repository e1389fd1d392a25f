#include "daemon/storage/store_layout.h"

#include <cctype>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/storage/delta_store.h"
#include "daemon/storage/manifest_mac.h"
#include "daemon/storage/safetensors.h"

namespace wb::storage {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool AllDigits(const std::string &s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool LowerHex(const std::string &s, size_t digits) {
  if (s.size() != digits) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) return false;
  }
  return true;
}

// What the publisher names rank files of (version, writer): "<v>.<writer>.<rank>.safetensors".
bool IsDataFileOf(const std::string &name, uint64_t version, const std::string &writer) {
  const std::string prefix = absl::StrCat(VersionPrefix(version), ".", writer, ".");
  const std::string suffix = ".safetensors";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      !EndsWith(name, suffix)) {
    return false;
  }
  const std::string rank = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return rank.size() <= 10 && AllDigits(rank);
}

// A JSON integer in [0, 2^64): nlohmann would quietly convert a negative or fractional number.
bool Unsigned(const json &j, const char *key, uint64_t *out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  *out = it->get<uint64_t>();
  return true;
}

bool String(const json &j, const char *key, std::string *out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

}  // namespace

std::string VersionPrefix(uint64_t version) { return absl::StrFormat("%020u", version); }

std::string ManifestName(uint64_t version, const std::string &writer) {
  return absl::StrCat(VersionPrefix(version), ".", writer, ".json");
}

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

absl::Status ParseVersionName(const std::string &name, uint64_t *version, std::string *rest) {
  size_t digits = 0;
  while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
  if (digits == 0) {
    return absl::InvalidArgumentError("does not start with a version number");
  }
  if (digits != static_cast<size_t>(kVersionDigits)) {
    return absl::InvalidArgumentError(absl::StrCat("its version number has ", digits,
                                                   " digits; version names have exactly ",
                                                   kVersionDigits, " (zero-padded)"));
  }
  uint64_t v = 0;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < digits; ++i) {
    const uint64_t d = static_cast<uint64_t>(name[i] - '0');
    if (v > (kMax - d) / 10) {
      return absl::OutOfRangeError(absl::StrCat("version number ", name.substr(0, digits),
                                                " is above 2^64 - 1 (", kMax, ")"));
    }
    v = v * 10 + d;
  }
  if (v == 0) return absl::InvalidArgumentError("version 0 is never published");
  if (digits + 1 >= name.size() || name[digits] != '.') {
    return absl::InvalidArgumentError("the version number is not followed by '.<name>'");
  }
  *version = v;
  *rest = name.substr(digits + 1);
  return absl::OkStatus();
}

bool SplitVersion(const std::string &name, uint64_t *version, std::string *rest) {
  return ParseVersionName(name, version, rest).ok();
}

bool EndsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool ValidWriterName(const std::string &writer) {
  if (writer.empty()) return false;
  for (char c : writer) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

Manifest ParseManifest(const std::string &bytes, const std::string &path, uint64_t version,
                       const std::string &writer, const std::string &key) {
  Manifest m;
  m.writer = writer;
  m.version = version;
  m.path = path;
  auto bad = [&](const std::string &what) {
    m.error = absl::StrCat(path, ": bad manifest: ", what);
    return m;
  };
  json j = json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  std::string format, kind, named_writer;
  uint64_t named_version = 0;
  if (!String(j, "format", &format) || format != kStoreFormat) {
    return bad(absl::StrCat("format is not ", kStoreFormat));
  }
  if (!Unsigned(j, "version", &named_version) || named_version != version) {
    return bad("version differs from its name");
  }
  if (!String(j, "writer", &named_writer) || named_writer != writer) {
    return bad("writer differs from its name");
  }
  if (!Unsigned(j, "base_version", &m.base_version)) return bad("base_version is not a number");
  if (!String(j, "kind", &kind) || (kind != "anchor" && kind != "delta")) {
    return bad("kind is neither anchor nor delta");
  }
  m.anchor = kind == "anchor";
  if (m.anchor ? m.base_version != 0 : (m.base_version == 0 || m.base_version >= version)) {
    return bad(absl::StrCat(m.anchor ? "an " : "a ", kind, " on base version ", m.base_version,
                            " of version ", version));
  }
  auto files = j.find("files");
  if (files == j.end() || !files->is_array() || files->empty()) return bad("files is empty");
  std::set<std::string> seen;
  for (const auto &f : *files) {
    FileRef ref;
    if (!f.is_object() || !String(f, "name", &ref.name) || !Unsigned(f, "bytes", &ref.bytes) ||
        !String(f, "checksum", &ref.checksum)) {
      return bad("a file entry needs name, bytes and checksum");
    }
    if (!IsDataFileOf(ref.name, version, writer)) {
      return bad(absl::StrCat("file '", ref.name, "' is not named ", VersionPrefix(version), ".",
                              writer, ".<rank>.safetensors"));
    }
    if (!seen.insert(ref.name).second) return bad(absl::StrCat("file '", ref.name, "' twice"));
    if (!LowerHex(ref.checksum, 16)) return bad(absl::StrCat("file '", ref.name, "': checksum"));
    if (f.contains("sha256") && (!String(f, "sha256", &ref.sha256) || !LowerHex(ref.sha256, 64))) {
      return bad(absl::StrCat("file '", ref.name, "': sha256 is not 64 hex digits"));
    }
    m.files.push_back(std::move(ref));
  }
  if (j.contains("mac") && !String(j, "mac", &m.mac)) return bad("mac is not a string");
  if (!key.empty()) {
    if (m.mac.empty()) {
      return bad(
          "it carries no MAC, but this agent has a storage token (written by a writer without "
          "the token?)");
    }
    if (!ManifestMacMatches(key, m)) {
      return bad(
          "its MAC does not match (written with another token, or altered after it was "
          "signed)");
    }
    for (const auto &f : m.files) {
      if (f.sha256.empty()) return bad(absl::StrCat("file '", f.name, "' has no sha256"));
    }
  }
  return m;
}

Manifest ReadManifest(const std::string &path, uint64_t version, const std::string &writer,
                      const std::string &key) {
  auto bytes = ReadWholeFile(path, kMaxManifestBytes);
  if (!bytes.ok()) {
    Manifest m;
    m.writer = writer;
    m.version = version;
    m.path = path;
    m.error = std::string(bytes.status().message());
    return m;
  }
  return ParseManifest(std::string(bytes->begin(), bytes->end()), path, version, writer, key);
}

absl::StatusOr<VersionMap> ListVersions(const std::string &dir, const std::string &key,
                                        std::vector<std::string> *ignored) {
  VersionMap out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return absl::InternalError(absl::StrCat("listing ", dir, ": ", ec.message()));
    const std::string name = it->path().filename().string();
    if (!EndsWith(name, ".json")) continue;
    uint64_t version = 0;
    std::string rest;
    absl::Status parsed = ParseVersionName(name, &version, &rest);
    const std::string writer = parsed.ok() ? rest.substr(0, rest.size() - 5) : "";
    if (parsed.ok() && !ValidWriterName(writer)) {
      parsed = absl::InvalidArgumentError(
          "the writer name between the version and '.json' is not letters, digits, '-' and '_'");
    }
    if (!parsed.ok()) {
      if (ignored) ignored->push_back(absl::StrCat(name, ": ", parsed.message()));
      continue;
    }
    out[version][writer] = ReadManifest(it->path().string(), version, writer, key);
  }
  return out;
}

}  // namespace wb::storage
