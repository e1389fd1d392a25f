// libFuzzer target for the storage directory's names and manifests (daemon/storage/store_layout.h),
// as a subscribing agent reads them from a directory anyone with write access may fill. Input:
// one byte choosing whether a storage key is configured, a file name up to the first NUL, then the
// manifest's bytes. Invariants: a name is accepted only in its one canonical spelling (so no two
// names are the same version); an accepted manifest names only its own version's and writer's
// rank files, has a consistent kind and base, and under a key carries that key's MAC.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "daemon/storage/delta_store.h"
#include "daemon/storage/manifest_mac.h"
#include "daemon/storage/store_layout.h"

namespace {
[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "manifest_fuzz invariant violated: %s\n", what);
  __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wb::storage;
  if (size < 1) return 0;
  static const std::string kKey = DeriveManifestKey("fuzz-token");
  const std::string key = (data[0] & 1) ? kKey : "";
  const char* text = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  const void* nul = std::memchr(text, 0, n);
  const size_t name_len = nul ? static_cast<const char*>(nul) - text : n;
  const std::string name(text, name_len);
  const std::string body = nul ? std::string(text + name_len + 1, n - name_len - 1) : "";

  uint64_t version = 0;
  std::string rest;
  if (!ParseVersionName(name, &version, &rest).ok()) return 0;
  if (version == 0 || rest.empty()) Fail("accepted version 0 or an empty rest");
  if (VersionPrefix(version) + "." + rest != name) Fail("accepted a non-canonical spelling");
  if (!EndsWith(rest, ".json")) return 0;
  const std::string writer = rest.substr(0, rest.size() - 5);
  if (!ValidWriterName(writer)) return 0;

  Manifest m = ParseManifest(body, "fuzz.json", version, writer, key);
  if (!m.error.empty()) return 0;
  if (m.version != version || m.writer != writer) Fail("version or writer differ from the name");
  if (m.anchor ? m.base_version != 0 : (m.base_version == 0 || m.base_version >= version)) {
    Fail("inconsistent kind and base version");
  }
  if (m.files.empty()) Fail("a manifest without files");
  const std::string prefix = VersionPrefix(version) + "." + writer + ".";
  for (const auto& f : m.files) {
    if (f.name.compare(0, prefix.size(), prefix) != 0 || f.name.find('/') != std::string::npos) {
      Fail("a file of another version or writer");
    }
    if (!key.empty() && f.sha256.size() != 64) Fail("a signed file without its SHA-256");
  }
  if (!key.empty() && !ManifestMacMatches(key, m)) Fail("accepted without the key's MAC");
  return 0;
}
