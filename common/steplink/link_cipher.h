// The sealing of a step link (docs/security.md, "Step links"): every message either way is one
// frame, a 4-byte little-endian length and then the message encrypted and authenticated with
// AES-256-GCM under the link's key. The 96-bit nonce is the sending direction and that
// direction's message count, never sent: both ends count, so a frame replayed, dropped,
// reordered or reflected back to its sender fails to open. The key comes from the agent in the
// controller's admitted OpenStepLink call; a connection opens with the link's id in clear and
// one sealed empty frame, which proves the key before anything runs.
#pragma once

#include <openssl/evp.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wb::steplink {

inline constexpr size_t kKeyBytes = 32;     // AES-256
inline constexpr size_t kLinkIdBytes = 16;  // names the key the agent handed out
inline constexpr size_t kTagBytes = 16;     // GCM tag
inline constexpr size_t kLengthBytes = 4;
// A connection's first bytes: the link id, then one sealed empty frame.
inline constexpr size_t kHelloBytes = kLinkIdBytes + kLengthBytes + kTagBytes;
// Largest sealed frame body either end accepts (a step command or reply is far smaller).
inline constexpr uint32_t kMaxFrameBody = uint32_t{64} << 20;

// Who sends: each direction has its own nonces, so a frame cannot be sent back to its sender.
enum class Direction : uint32_t { kToAgent = 1, kToController = 2 };

// `n` random bytes from OpenSSL's generator.
absl::StatusOr<std::string> RandomBytes(size_t n);

class FrameReader;

class LinkCipher {
 public:
  // `key` must be kKeyBytes long; this end sends in direction `send`.
  static absl::StatusOr<LinkCipher> Create(std::string_view key, Direction send);
  LinkCipher(LinkCipher&&) = default;
  LinkCipher& operator=(LinkCipher&&) = default;

  // Appends the frame carrying `plain` to `out`. Fails only if OpenSSL does or `plain` is over
  // the frame limit.
  absl::Status Seal(std::string_view plain, std::string* out);
  // Opens the next frame from the other end: `body` is the frame without its length prefix.
  // Fails (and the link must close) when the frame is not the peer's next one under this key.
  absl::Status Open(std::string_view body, std::string* plain);

  // Opens, in order, every whole frame `reader` holds and hands each message to `take`; stops
  // at the first frame that is malformed or does not open, or that `take` refuses (the link
  // must then close).
  absl::Status OpenEach(FrameReader* reader,
                        const std::function<absl::Status(const std::string& message)>& take);
  // `frame` (length prefix included) must be exactly the peer's next frame, sealed and empty:
  // the handshake's proof of the key, either way.
  absl::Status OpenEmptyFrame(std::string_view frame);

  uint64_t sent() const { return sent_; }
  uint64_t received() const { return received_; }

 private:
  struct CtxFree {
    void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
  };
  using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;
  LinkCipher(Ctx seal, Ctx open, Direction send, Direction receive)
      : seal_(std::move(seal)), open_(std::move(open)), send_(send), receive_(receive) {}

  Ctx seal_, open_;
  Direction send_, receive_;
  uint64_t sent_ = 0, received_ = 0;
};

// Bytes read from a link's socket, cut into frames.
class FrameReader {
 public:
  explicit FrameReader(uint32_t max_body = kMaxFrameBody) : max_body_(max_body) {}
  void Append(const char* data, size_t n) { buffer_.append(data, n); }
  // The next whole frame's body, if one has arrived (valid until the next call); an error when
  // the length is over the limit or too short to hold a tag.
  absl::StatusOr<bool> Next(std::string_view* body);
  size_t buffered() const { return buffer_.size() - start_; }

 private:
  uint32_t max_body_;
  std::string buffer_;
  size_t start_ = 0;  // where the unread bytes begin
};

}  // namespace wb::steplink
