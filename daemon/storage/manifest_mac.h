// Keyed manifests (issue 14, class 9): with a cluster token configured, every manifest carries an
// HMAC-SHA256 over its canonical contents, which name a SHA-256 of every data file, so a writer
// without the token can neither forge a version nor alter a file of a genuine one. OpenSSL's
// libcrypto does the hashing.
#pragma once

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "daemon/storage/store_layout.h"

struct evp_md_ctx_st;

namespace wb::storage {

// SHA-256 of a byte stream, as 64 lowercase hex digits.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256 &) = delete;
  Sha256 &operator=(const Sha256 &) = delete;
  void Update(absl::Span<const uint8_t> bytes);
  std::string HexFinal();

 private:
  evp_md_ctx_st *ctx_;
};

std::string Sha256Hex(absl::Span<const uint8_t> bytes);

// The key manifests are signed with: HMAC-SHA256(token, "weightbeam storage manifest v1"), so the
// token itself never keys anything but this derivation (32 raw bytes).
std::string DeriveManifestKey(const std::string &token);

// The bytes a manifest's MAC covers: format, version, base version, kind, writer and every file's
// name, size, checksum and SHA-256, each length-prefixed so that no two manifests share them.
std::string CanonicalManifest(const Manifest &m);

// "hmac-sha256:<64 hex>" of CanonicalManifest(m) under `key`.
std::string ManifestMac(const std::string &key, const Manifest &m);
// Whether `m.mac` is ManifestMac(key, m), compared in constant time.
bool ManifestMacMatches(const std::string &key, const Manifest &m);

}  // namespace wb::storage
