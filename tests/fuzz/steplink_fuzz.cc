// libFuzzer target for the step link's frame layer (common/steplink/link_cipher.h), as the
// agent's listener and the controller read it from a socket: the input is cut into reads of a
// size its first byte picks and fed to FrameReader; every frame it yields is within its limits
// and is then opened under the link key, and the first that does not open ends the link, as
// it does in the daemons. Also: any input sealed as one message opens back to itself, whatever
// the read boundaries.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/steplink/link_cipher.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using wb::steplink::Direction;
using wb::steplink::FrameReader;
using wb::steplink::LinkCipher;

constexpr char kTarget[] = "steplink_fuzz";
constexpr uint32_t kMaxBody = 4096;
// The seeds' frames are sealed under this key (tests/fuzz/corpus/steplink).
const std::string kKey(32, '\x42');

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);

  // What a reader does with bytes from a peer.
  auto receiver = LinkCipher::Create(kKey, Direction::kToController);
  CHECK_INVARIANT(receiver.ok());
  FrameReader reader(kMaxBody);
  bool open = true;
  for (size_t at = 0; open && at < stream.size(); at += piece) {
    reader.Append(stream.data() + at, std::min(piece, stream.size() - at));
    while (open) {
      std::string_view body;
      auto has = reader.Next(&body);
      if (!has.ok()) {
        open = false;  // a bad length closes the link
        break;
      }
      if (!*has) break;
      CHECK_INVARIANT(body.size() >= wb::steplink::kTagBytes && body.size() <= kMaxBody);
      std::string plain;
      const uint64_t before = receiver->received();
      if (receiver->Open(body, &plain).ok()) {
        CHECK_INVARIANT(plain.size() == body.size() - wb::steplink::kTagBytes);
        CHECK_INVARIANT(receiver->received() == before + 1);
      } else {
        CHECK_INVARIANT(receiver->received() == before);
        CHECK_INVARIANT(plain.empty());
        open = false;
      }
    }
  }

  // Sealed, any message opens back to itself.
  if (stream.size() <= kMaxBody - wb::steplink::kTagBytes) {
    auto sender = LinkCipher::Create(kKey, Direction::kToAgent);
    auto agent = LinkCipher::Create(kKey, Direction::kToController);  // receives kToAgent
    std::string frame;
    CHECK_INVARIANT(sender->Seal(stream, &frame).ok());
    FrameReader back(kMaxBody);
    std::string plain;
    bool got = false;
    for (size_t at = 0; at < frame.size(); at += piece) {
      back.Append(frame.data() + at, std::min(piece, frame.size() - at));
      std::string_view body;
      auto has = back.Next(&body);
      CHECK_INVARIANT(has.ok());
      if (*has) {
        CHECK_INVARIANT(!got);
        CHECK_INVARIANT(agent->Open(body, &plain).ok());
        got = true;
      }
    }
    CHECK_INVARIANT(got && plain == stream);
  }
  return 0;
}
