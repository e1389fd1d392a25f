// A trainer rank's or inference worker's session with its node agent (Unix socket): register
// tensors held in shared memory or GPU memory, and watch begin/commit/abort events. Closing the
// session (or the process ending) withdraws its tensors.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/weightbeam/shared_buffer.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::client {

struct TensorInfo {
  std::string name;
  weightbeam::v1::DType dtype = weightbeam::v1::DTYPE_BF16;
  std::vector<int64_t> global_shape;
  // Per dimension (start, size); empty for a full tensor.
  std::vector<std::pair<int64_t, int64_t>> shard;
  // A part of a larger buffer (an engine parameter): the memory holds the whole buffer of
  // `view_shape`, the shard's dims map onto its last dims, element [0..0] at `view_offset`.
  // Empty `view_shape`: the memory holds the shard densely.
  std::vector<int64_t> view_shape;
  std::vector<int64_t> view_offset;
  std::string view_buffer;
};

// One tensor of a batch registration: `length` bytes at `offset` of the batch's buffer.
struct BufferSlice {
  TensorInfo tensor;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct Identity {
  weightbeam::v1::Role role = weightbeam::v1::ROLE_TRAINER;
  int rank = 0;
  int replica = 0;
};

// What the agent wrote for one version on the storage path (see LocalSession::Publish).
struct PublishReport {
  uint64_t version = 0;
  bool anchor = false;  // a dense anchor; else a delta on base_version
  uint64_t base_version = 0;
  uint64_t bytes_written = 0;  // all files of the version
  uint64_t dense_bytes = 0;    // a dense checkpoint of the same tensors
  uint64_t changed_elements = 0;
  std::vector<std::string> files;
  double seconds = 0;
};

class LocalSession {
 public:
  static absl::StatusOr<LocalSession> Connect(const std::string& socket_path, const Identity& who);
  LocalSession(LocalSession&&) noexcept;
  LocalSession& operator=(LocalSession&&) noexcept;
  ~LocalSession();

  // Registers `length` bytes at `offset` of `buffer` as the tensor. The agent's error (shape
  // mismatch, unknown dtype, duplicate...) comes back intact.
  absl::Status Register(const TensorInfo& tensor, const SharedBuffer& buffer, uint64_t offset,
                        uint64_t length);
  // Registers many tensors of one buffer in one request, all or nothing: on the first refusal
  // none of them stays registered and the error names that tensor. Much faster than one
  // Register per tensor for thousands of small tensors.
  absl::Status RegisterBatch(const std::vector<BufferSlice>& tensors, const SharedBuffer& buffer);
  // Registers many batches of one buffer, pipelined: up to `in_flight` requests are on their
  // way while the agent answers the earlier ones, so neither side waits for the other between
  // batches. The agent handles them in order, each all or nothing as RegisterBatch. Every name
  // is checked first (an invalid one: nothing is sent). After a refusal no further batch is
  // sent; those already sent are answered and stay as they came out (registered or refused),
  // so nothing registered is lost. Returns OK or the first refusal, which names its batch and
  // the agent's message (the tensor). `outcomes`, when given, gets one status per batch: OK
  // (registered), the agent's refusal, or CANCELLED (not sent after an earlier refusal).
  absl::Status RegisterBatches(const std::vector<std::vector<BufferSlice>>& batches,
                               const SharedBuffer& buffer, int in_flight = 4,
                               std::vector<absl::Status>* outcomes = nullptr);
  // Registers `length` bytes of cudaMalloc'ed memory at `device_ptr` (on CUDA device `device`)
  // through a CUDA IPC handle; needs CUDA here and an agent built with CUDA. Without CUDA the
  // error says so and names the tensor.
  absl::Status RegisterCuda(const TensorInfo& tensor, void* device_ptr, uint64_t length,
                            int device);
  // Call after the optimizer step, before the step starts (rank 0 before Step(), the other
  // ranks before the barrier that precedes it): waits until every stream of this process on
  // each device it registered GPU tensors on is idle, so the agent never reads weights the
  // trainer's kernels are still writing (docs/clients.md). Ok at once without GPU tensors.
  absl::Status SourcesReady();
  absl::Status Unregister(const std::string& name);
  // How long one request (register, unregister) may wait for the agent's answer (default
  // 120 s). When it passes the call fails with DEADLINE_EXCEEDED and the session is closed:
  // the agent withdraws its tensors, as when the process ends.
  void SetCallTimeout(std::chrono::milliseconds timeout);

  // Storage path (agent config `storage.role: publish`, trainer sessions): the agent writes
  // version `version` of every trainer tensor registered with it into its storage directory
  // and answers once the version is complete there. Versions must increase.
  absl::StatusOr<PublishReport> Publish(uint64_t version);

  // Starts watching events (begin/commit/abort) and returns once the agent confirms the
  // subscription (waiting up to `confirm_timeout`): every event published after Watch()
  // returns is delivered. Agents too old to confirm are waited for the full timeout.
  absl::Status Watch(std::chrono::milliseconds confirm_timeout = std::chrono::seconds(5));
  // The same, as a watcher that answers (agent receive.mode staged, docs/clients.md): with
  // `ack` the agent's swap of each version waits (up to its receive.ack_timeout_ms) for this
  // session's Ack(v) after begin(v), sent once the engine has paused; with `swap` this watcher
  // hears ready(v) instead of begin(v), copies the staged bytes (Event.staged) into its live
  // tensors itself and answers Ack(v), or Ack(v, error) when that failed. The watcher name is
  // this session's (watcher_name()) unless `watcher` names one.
  struct WatchOptions {
    bool ack = false;
    bool swap = false;
    std::string watcher;
  };
  absl::Status Watch(const WatchOptions& options,
                     std::chrono::milliseconds confirm_timeout = std::chrono::seconds(5));
  // The name this session's acknowledging watch uses.
  std::string watcher_name() const;
  // Answers the agent for `version` (see WatchOptions): paused, swapped, or (error not
  // empty) the swap failed, which drops this replica from the step, naming the error.
  absl::Status Ack(uint64_t version, const std::string& error = "");
  // The agent's committed version when the subscription was confirmed (0 before Watch).
  uint64_t watch_start_version() const;
  // The next event, or DEADLINE_EXCEEDED after `timeout`.
  absl::StatusOr<weightbeam::v1::Event> NextEvent(std::chrono::milliseconds timeout);

  void Close();

 private:
  struct Impl;
  explicit LocalSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wb::client
