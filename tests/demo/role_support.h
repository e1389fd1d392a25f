// What the synthetic roles of wb-demo and wb-cluster share: an entry's size and shard geometry,
// its client registration info, one shared-memory buffer for all entries, the driver's stdin,
// the bit-for-bit comparison (BF16 bytes, FP8 block quantization with its scales) and both
// sides of the driver's line protocol.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/weightbeam/local_session.h"
#include "client/weightbeam/shared_buffer.h"
#include "common/planner/models.h"

namespace wb::demo {

// Elements of an entry's buffer, and its bytes.
uint64_t EntryElements(const planner::TensorEntry& e);
uint64_t EntryBytes(const planner::TensorEntry& e);

uint64_t Align64(uint64_t n);
uint64_t Total(const std::vector<int64_t>& shape);

// An entry's shard as a rectangle of its tensor viewed as 2-D (a 1-D tensor is one row).
struct Rect {
  int64_t r0, nr, c0, nc, cols;
};
Rect ShardRect(const planner::TensorEntry& e);

client::TensorInfo InfoOf(const planner::TensorEntry& e);

// A synthetic model: its training-side (unfused) tensors and the trainer + inference agent
// layouts the planner's model library generates for it.
struct SyntheticModel {
  planner::ModelSpec spec;
  std::vector<planner::AgentLayout> layouts;
};

// Lays `spec` out for `trainer` and `inference` with one NIC per agent and FP8 block-scaled
// inference weights, as wb-demo and wb-cluster both run it.
absl::StatusOr<SyntheticModel> LayOut(planner::ModelSpec spec, planner::TrainerOptions trainer,
                                      planner::InferenceOptions inference);

// The tensors one process registers: those owned by `role`, `replica` and `rank`.
std::vector<planner::TensorEntry> EntriesOf(const SyntheticModel& model, planner::Role role,
                                            int replica, int rank);

// One shared-memory buffer holding every entry (each 64-byte aligned).
struct Registered {
  client::SharedBuffer buffer;
  std::vector<uint64_t> offsets;  // per entry
};
absl::StatusOr<Registered> Allocate(const std::vector<planner::TensorEntry>& entries,
                                    const std::string& name);
// The same for buffers of `sizes` bytes.
absl::StatusOr<Registered> AllocateSizes(const std::vector<uint64_t>& sizes,
                                         const std::string& name);

// A role's session on its agent and the one buffer for all its entries (not yet registered).
struct Side {
  client::LocalSession session;
  Registered reg;
};
// Connects to `socket` as `who` and allocates `buffer_name` for `entries`; a failure is printed
// to stderr after `log_name` ("trainer 3") and gives nullopt.
std::optional<Side> OpenSide(const std::string& socket, const client::Identity& who,
                             const std::vector<planner::TensorEntry>& entries,
                             const std::string& buffer_name, const std::string& log_name);

// Registers every entry of `side` (in batches of 1000); a failure is printed after `log_name`.
bool RegisterAll(Side& side, const std::vector<planner::TensorEntry>& entries,
                 const std::string& log_name);

// The training-side tensors a destination is fused from (the default fusion rules of
// config/config.h), in order; just its own name when it is not fused.
std::vector<std::string> FusionParts(const std::string& name);

// Whether the driver has closed our stdin (it only closes it, it sends nothing).
bool StdinClosed();

// "" when the bytes match, else "<name> at byte i: expected .., found ..".
std::string FirstMismatch(const std::string& name, const uint8_t* want, const uint8_t* got,
                          uint64_t bytes);

// Checks an FP8 block-scaled destination (rows x cols) against its expected BF16 values: its
// bytes at `got` and, when `scale` is registered (non-null), its scales at `scale_got`. Returns
// the first mismatch ("" when none) and adds the bytes checked to *checked.
std::string CheckFp8(const planner::TensorEntry& e, const std::vector<uint16_t>& want,
                     uint64_t rows, uint64_t cols, const uint8_t* got,
                     const planner::TensorEntry* scale, const uint8_t* scale_got,
                     uint64_t* checked);

// The same without planner entries: `name`'s FP8 bytes and, when `scale_name` is not empty, its
// `scale_bytes` of f32 scales at `scale_got`.
std::string CheckFp8Block(const std::string& name, const std::vector<uint16_t>& want, uint64_t rows,
                          uint64_t cols, const uint8_t* got, const std::string& scale_name,
                          uint64_t scale_bytes, const uint8_t* scale_got, uint64_t* checked);

// BF16 values widened to float32 (the form of an F32 entry that holds BF16-valued numbers).
void WriteF32(const uint16_t* bf16, uint64_t n, float* out);

// The driver's line protocol, trainer side: prints "ready BYTES N" for `entries`, then answers
// each "perturb V" line on stdin with `perturb(V)` and "ok V", until stdin ends.
void ServeTrainerLines(const std::vector<planner::TensorEntry>& entries,
                       const std::function<void(uint32_t version)>& perturb);
// The same for `count` tensors of `bytes` in all.
void ServeTrainerLines(uint64_t bytes, size_t count,
                       const std::function<void(uint32_t version)>& perturb);

// The BF16 values an entry must hold at the version being checked, and its 2-D size.
using ExpectedValues = std::function<std::vector<uint16_t>(const planner::TensorEntry& e,
                                                           uint64_t* rows, uint64_t* cols)>;

// The driver's line protocol, inference side: prints "ready BYTES N", then follows the session's
// events until the driver closes stdin. An abort prints "aborted V REASON"; commit(V) calls
// `advance(V)` (an error fails that version's check) and checks every entry in `reg` against
// `expected` (BF16 and F32 bit for bit, FP8 with its scales through CheckFp8; a scale entry with
// its weight), printing "verified V PASS BYTES" or "verified V FAIL WHY". A failed event stream is
// an error naming `who` on stderr (and "gone WHY" on stdout when `say_gone`); then it returns 1.
int ServeInferenceChecks(client::LocalSession& session,
                         const std::vector<planner::TensorEntry>& entries, const Registered& reg,
                         const std::string& who, bool say_gone,
                         const std::function<absl::Status(uint32_t version)>& advance,
                         const ExpectedValues& expected);

// The same protocol for `count` tensors of `bytes` in all, checked by `check` after each
// commit: it returns the first mismatch ("" when none) and adds the bytes it compared to
// *checked.
using CheckCommitted = std::function<std::string(uint64_t* checked)>;
int ServeCommitChecks(client::LocalSession& session, uint64_t bytes, size_t count,
                      const std::string& who, bool say_gone,
                      const std::function<absl::Status(uint32_t version)>& advance,
                      const CheckCommitted& check);

}  // namespace wb::demo
