#include "daemon/gpu/staging_pipeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace wb::gpu {

absl::Status ValidateStagingOptions(const StagingOptions& options) {
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kMaxChunk = uint64_t{1} << 30;
  if (options.chunk_bytes < kPage || options.chunk_bytes > kMaxChunk ||
      options.chunk_bytes % kPage != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU staging: chunk_bytes ", options.chunk_bytes,
                     " must be a multiple of 4096 between 4 KiB and 1 GiB"));
  }
  if (options.depth < 2 || options.depth > 8) {
    return absl::InvalidArgumentError(absl::StrCat("GPU staging: depth ", options.depth,
                                                   " must be 2 .. 8 pinned buffers (2 = double)"));
  }
  return absl::OkStatus();
}

uint64_t StagedChunkCount(uint64_t length, const StagingOptions& options) {
  return (length + options.chunk_bytes - 1) / options.chunk_bytes;
}

StagedChunk StagedChunkAt(uint64_t index, uint64_t length, const StagingOptions& options) {
  StagedChunk chunk;
  chunk.offset = index * options.chunk_bytes;
  chunk.bytes = chunk.offset < length ? std::min(options.chunk_bytes, length - chunk.offset) : 0;
  chunk.buffer = static_cast<int>(index % static_cast<uint64_t>(options.depth));
  return chunk;
}

namespace {

// The first error wins; the engine is always drained so no copy outlives the call.
absl::Status Drain(CopyEngine& engine, absl::Status status) {
  absl::Status waited = engine.WaitAll();
  return status.ok() ? waited : status;
}

}  // namespace

absl::Status StageFromDevice(CopyEngine& engine, const uint8_t* device_src, uint64_t length,
                             const ChunkSink& sink) {
  const StagingOptions& o = engine.options();
  const uint64_t chunks = StagedChunkCount(length, o);
  // Prime the ring: up to `depth` copies in flight before the first one is consumed.
  uint64_t enqueued = 0;
  for (; enqueued < chunks && enqueued < static_cast<uint64_t>(o.depth); ++enqueued) {
    const StagedChunk c = StagedChunkAt(enqueued, length, o);
    if (auto s = engine.EnqueueToHost(c.buffer, device_src + c.offset, c.bytes); !s.ok()) {
      return Drain(engine, s);
    }
  }
  for (uint64_t i = 0; i < chunks; ++i) {
    const StagedChunk c = StagedChunkAt(i, length, o);
    if (auto s = engine.WaitBuffer(c.buffer); !s.ok()) return Drain(engine, s);
    if (auto s = sink(engine.buffer(c.buffer), c.offset, c.bytes); !s.ok()) {
      return Drain(engine, s);
    }
    // The buffer is free again: refill it with the chunk `depth` ahead.
    if (enqueued < chunks) {
      const StagedChunk next = StagedChunkAt(enqueued, length, o);
      if (auto s = engine.EnqueueToHost(next.buffer, device_src + next.offset, next.bytes);
          !s.ok()) {
        return Drain(engine, s);
      }
      ++enqueued;
    }
  }
  return Drain(engine, absl::OkStatus());
}

absl::Status StageToDevice(CopyEngine& engine, uint8_t* device_dst, uint64_t length,
                           const ChunkSource& source) {
  const StagingOptions& o = engine.options();
  const uint64_t chunks = StagedChunkCount(length, o);
  for (uint64_t i = 0; i < chunks; ++i) {
    const StagedChunk c = StagedChunkAt(i, length, o);
    // The buffer's previous copy (chunk i - depth) must have left it before it is refilled.
    if (i >= static_cast<uint64_t>(o.depth)) {
      if (auto s = engine.WaitBuffer(c.buffer); !s.ok()) return Drain(engine, s);
    }
    if (auto s = source(engine.buffer(c.buffer), c.offset, c.bytes); !s.ok()) {
      return Drain(engine, s);
    }
    if (auto s = engine.EnqueueToDevice(device_dst + c.offset, c.buffer, c.bytes); !s.ok()) {
      return Drain(engine, s);
    }
  }
  return Drain(engine, absl::OkStatus());
}

}  // namespace wb::gpu
