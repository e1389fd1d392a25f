#include "common/steplink/link_cipher.h"

#include <openssl/rand.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace wb::steplink {

namespace {

constexpr size_t kNonceBytes = 12;

// Direction, then the message count, both little-endian.
void MakeNonce(Direction d, uint64_t count, unsigned char nonce[kNonceBytes]) {
  const uint32_t dir = static_cast<uint32_t>(d);
  for (int i = 0; i < 4; ++i) nonce[i] = static_cast<unsigned char>(dir >> (8 * i));
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(count >> (8 * i));
}

void PutLength(uint32_t n, char out[kLengthBytes]) {
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<char>(n >> (8 * i));
}

uint32_t GetLength(const char* p) {
  uint32_t n = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) {
    n |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return n;
}

}  // namespace

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError("OpenSSL's random generator failed");
  }
  return out;
}

absl::StatusOr<LinkCipher> LinkCipher::Create(std::string_view key, Direction send) {
  if (key.size() != kKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step link key has ", kKeyBytes, " bytes, this one ", key.size()));
  }
  const auto* k = reinterpret_cast<const unsigned char*>(key.data());
  Ctx seal(EVP_CIPHER_CTX_new()), open(EVP_CIPHER_CTX_new());
  // The key is set once; each message only sets its nonce.
  if (!seal || !open ||
      EVP_EncryptInit_ex(seal.get(), EVP_aes_256_gcm(), nullptr, k, nullptr) != 1 ||
      EVP_DecryptInit_ex(open.get(), EVP_aes_256_gcm(), nullptr, k, nullptr) != 1) {
    return absl::InternalError("OpenSSL cannot set up AES-256-GCM");
  }
  const Direction receive =
      send == Direction::kToAgent ? Direction::kToController : Direction::kToAgent;
  return LinkCipher(std::move(seal), std::move(open), send, receive);
}

absl::Status LinkCipher::Seal(std::string_view plain, std::string* out) {
  if (plain.size() > kMaxFrameBody - kTagBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a step link message of ", plain.size(),
                                                     " bytes is over the ", kMaxFrameBody,
                                                     "-byte frame limit"));
  }
  unsigned char nonce[kNonceBytes];
  MakeNonce(send_, sent_, nonce);
  const size_t at = out->size();
  out->resize(at + kLengthBytes + plain.size() + kTagBytes);
  char* frame = out->data() + at;
  PutLength(static_cast<uint32_t>(plain.size() + kTagBytes), frame);
  auto* cipher = reinterpret_cast<unsigned char*>(frame + kLengthBytes);
  int n = 0, tail = 0;
  if (EVP_EncryptInit_ex(seal_.get(), nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_EncryptUpdate(seal_.get(), cipher, &n,
                        reinterpret_cast<const unsigned char*>(plain.data()),
                        static_cast<int>(plain.size())) != 1 ||
      EVP_EncryptFinal_ex(seal_.get(), cipher + n, &tail) != 1 ||
      EVP_CIPHER_CTX_ctrl(seal_.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, cipher + plain.size()) !=
          1) {
    out->resize(at);
    return absl::InternalError("OpenSSL failed to seal a step link message");
  }
  ++sent_;
  return absl::OkStatus();
}

absl::Status LinkCipher::Open(std::string_view body, std::string* plain) {
  if (body.size() < kTagBytes) {
    return absl::DataLossError("step link frame shorter than its tag");
  }
  unsigned char nonce[kNonceBytes];
  MakeNonce(receive_, received_, nonce);
  const size_t n = body.size() - kTagBytes;
  plain->resize(n);
  unsigned char tag[kTagBytes];
  std::memcpy(tag, body.data() + n, kTagBytes);
  int got = 0, tail = 0;
  if (EVP_DecryptInit_ex(open_.get(), nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_DecryptUpdate(open_.get(), reinterpret_cast<unsigned char*>(plain->data()), &got,
                        reinterpret_cast<const unsigned char*>(body.data()),
                        static_cast<int>(n)) != 1 ||
      EVP_CIPHER_CTX_ctrl(open_.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) != 1 ||
      EVP_DecryptFinal_ex(open_.get(), reinterpret_cast<unsigned char*>(plain->data()) + got,
                          &tail) != 1) {
    plain->clear();
    return absl::PermissionDeniedError(
        absl::StrCat("step link frame #", received_,
                     " does not open under the link's key (forged, replayed or out of order)"));
  }
  ++received_;
  return absl::OkStatus();
}

absl::Status LinkCipher::OpenEach(
    FrameReader* reader, const std::function<absl::Status(const std::string& message)>& take) {
  std::string plain;
  while (true) {
    std::string_view body;
    auto has = reader->Next(&body);
    if (!has.ok()) return has.status();
    if (!*has) return absl::OkStatus();
    if (auto s = Open(body, &plain); !s.ok()) return s;
    if (auto s = take(plain); !s.ok()) return s;
  }
}

absl::Status LinkCipher::OpenEmptyFrame(std::string_view frame) {
  if (frame.size() != kLengthBytes + kTagBytes) {
    return absl::DataLossError(absl::StrCat("a handshake frame of ", frame.size(),
                                            " bytes (an empty one has ", kLengthBytes + kTagBytes,
                                            ")"));
  }
  FrameReader reader;
  reader.Append(frame.data(), frame.size());
  std::string_view body;
  auto has = reader.Next(&body);
  if (!has.ok()) return has.status();
  if (!*has) return absl::DataLossError("a malformed handshake frame");
  std::string plain;
  if (auto s = Open(body, &plain); !s.ok()) return s;
  if (!plain.empty()) return absl::DataLossError("a handshake frame that is not empty");
  return absl::OkStatus();
}

absl::StatusOr<bool> FrameReader::Next(std::string_view* body) {
  if (start_ > 0 && start_ * 2 >= buffer_.size()) {  // keep the buffer from growing for ever
    buffer_.erase(0, start_);
    start_ = 0;
  }
  if (buffer_.size() - start_ < kLengthBytes) return false;
  const uint32_t n = GetLength(buffer_.data() + start_);
  if (n < kTagBytes || n > max_body_) {
    return absl::DataLossError(absl::StrCat("step link frame of ", n, " bytes (at least ",
                                            kTagBytes, ", at most ", max_body_, ")"));
  }
  if (buffer_.size() - start_ - kLengthBytes < n) return false;
  *body = std::string_view(buffer_.data() + start_ + kLengthBytes, n);
  start_ += kLengthBytes + n;
  return true;
}

}  // namespace wb::steplink
