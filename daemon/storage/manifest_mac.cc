#include "daemon/storage/manifest_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "daemon/storage/delta_store.h"

namespace wb::storage {

namespace {

constexpr char kKeyLabel[] = "weightbeam storage manifest v1";
constexpr char kMacPrefix[] = "hmac-sha256:";

std::string ToHex(const unsigned char *p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

std::string Hmac(const std::string &key, const std::string &data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char *>(data.data()), data.size(), out,
           &len) == nullptr) {
    std::abort();  // only on allocation failure inside libcrypto
  }
  return std::string(reinterpret_cast<const char *>(out), len);
}

void Field(std::string *out, const std::string &value) {
  absl::StrAppend(out, value.size(), ":", value, "\n");
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) std::abort();
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::Update(absl::Span<const uint8_t> bytes) {
  if (!bytes.empty()) EVP_DigestUpdate(ctx_, bytes.data(), bytes.size());
}

std::string Sha256::HexFinal() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_, out, &len);
  return ToHex(out, len);
}

std::string Sha256Hex(absl::Span<const uint8_t> bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.HexFinal();
}

std::string DeriveManifestKey(const std::string &token) { return Hmac(token, kKeyLabel); }

std::string CanonicalManifest(const Manifest &m) {
  std::string out = absl::StrCat(kKeyLabel, "\n");
  Field(&out, kStoreFormat);
  Field(&out, absl::StrCat(m.version));
  Field(&out, absl::StrCat(m.base_version));
  Field(&out, m.anchor ? "anchor" : "delta");
  Field(&out, m.writer);
  Field(&out, absl::StrCat(m.files.size()));
  for (const auto &f : m.files) {
    Field(&out, f.name);
    Field(&out, absl::StrCat(f.bytes));
    Field(&out, f.checksum);
    Field(&out, f.sha256);
  }
  return out;
}

std::string ManifestMac(const std::string &key, const Manifest &m) {
  const std::string mac = Hmac(key, CanonicalManifest(m));
  return absl::StrCat(kMacPrefix,
                      ToHex(reinterpret_cast<const unsigned char *>(mac.data()), mac.size()));
}

bool ManifestMacMatches(const std::string &key, const Manifest &m) {
  const std::string want = ManifestMac(key, m);
  return m.mac.size() == want.size() && CRYPTO_memcmp(m.mac.data(), want.data(), want.size()) == 0;
}

}  // namespace wb::storage
