// The pipelined staging of device memory through pinned host buffers, without CUDA: chunking
// (which bytes go through which buffer) and the order of copies against the host-side work, on
// top of a small CopyEngine interface. staging_cuda.cc supplies the engine (one stream, one
// event per buffer); tests supply a fake, so the pipeline's order and error paths run anywhere.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"

namespace wb::gpu {

struct StagingOptions {
  uint64_t chunk_bytes = 4 << 20;  // bytes per pinned buffer (and per network send)
  int depth = 2;                   // pinned buffers in the ring: 2 = double buffering
};

// Ok when chunk_bytes is 4 KiB .. 1 GiB and a multiple of 4 KiB, and depth is 2 .. 8; else
// InvalidArgument naming the field and the accepted range.
absl::Status ValidateStagingOptions(const StagingOptions& options);

// Chunk i of a `length`-byte transfer: [offset, offset + bytes) staged through buffer
// i % depth.
struct StagedChunk {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int buffer = 0;
};
uint64_t StagedChunkCount(uint64_t length, const StagingOptions& options);
StagedChunk StagedChunkAt(uint64_t index, uint64_t length, const StagingOptions& options);

// Asynchronous copies between device memory and the ring's pinned buffers. Copies enqueued on
// one engine run in order; WaitBuffer waits for the last copy enqueued through that buffer.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const StagingOptions& options() const = 0;
  virtual uint8_t* buffer(int index) = 0;
  virtual absl::Status EnqueueToHost(int buffer, const uint8_t* device_src, uint64_t bytes) = 0;
  virtual absl::Status EnqueueToDevice(uint8_t* device_dst, int buffer, uint64_t bytes) = 0;
  virtual absl::Status WaitBuffer(int buffer) = 0;
  // Waits for everything enqueued (also after an error, so no copy outlives its buffers).
  virtual absl::Status WaitAll() = 0;
};

// Hands the host side one staged chunk: `data` holds `bytes` bytes of the transfer starting at
// `offset`. A non-ok status stops the transfer and is returned as is.
using ChunkSink = std::function<absl::Status(const uint8_t* data, uint64_t offset, uint64_t bytes)>;
// Fills `data` with `bytes` bytes of the transfer starting at `offset`.
using ChunkSource = std::function<absl::Status(uint8_t* data, uint64_t offset, uint64_t bytes)>;

// Device -> host: the copy of chunk i + 1 (up to depth - 1 ahead) is in flight while `sink`
// consumes chunk i (e.g. sends it on a socket).
absl::Status StageFromDevice(CopyEngine& engine, const uint8_t* device_src, uint64_t length,
                             const ChunkSink& sink);
// Host -> device: `source` fills chunk i + 1 (e.g. receives it from a socket) while chunk i is
// copied to the device. Returns once every byte has landed on the device.
absl::Status StageToDevice(CopyEngine& engine, uint8_t* device_dst, uint64_t length,
                           const ChunkSource& source);

}  // namespace wb::gpu
