#include "common/identity/incarnation_digest.h"

#include <openssl/sha.h>

namespace wb::identity {

std::string IncarnationDigest(const std::string& incarnation) {
  const std::string input = "weightbeam agent incarnation v1\n" + incarnation;
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(input.data()), input.size(), out);
  return std::string(reinterpret_cast<const char*>(out), sizeof(out));
}

}  // namespace wb::identity
