#include "daemon/transport/local/guarded_copy.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/staging.h"
#include "daemon/registry/bus_guard.h"

namespace wb::transport::local {
namespace {

absl::Status Gone() {
  return absl::FailedPreconditionError(
      "hit memory that is gone (SIGBUS: a shared-memory object was shrunk after registration)");
}

// memmove under the guard.
absl::Status GuardedMove(void* dst, const void* src, uint64_t bytes) {
  if (!registry::RunBusGuarded([&] { std::memmove(dst, src, bytes); })) return Gone();
  return absl::OkStatus();
}

class CudaCopies : public DeviceCopies {
 public:
  absl::Status ToDevice(int device, uint8_t* dst, uint64_t length,
                        const gpu::ChunkSource& source) override {
    auto staging = staging_.Get();
    if (!staging.ok()) return staging.status();
    return (*staging)->WriteToDevice(device, dst, length, source);
  }
  absl::Status FromDevice(int device, const uint8_t* src, uint64_t length,
                          const gpu::ChunkSink& sink) override {
    auto staging = staging_.Get();
    if (!staging.ok()) return staging.status();
    return (*staging)->ReadFromDevice(device, src, length, sink);
  }
  absl::Status DeviceToDevice(int device, uint8_t* dst, const uint8_t* src,
                              uint64_t length) override {
    return gpu::CopyAnyToAny(dst, src, length, device);
  }

 private:
  gpu::LazyStaging staging_;
};

}  // namespace

std::unique_ptr<DeviceCopies> CudaDeviceCopies() { return std::make_unique<CudaCopies>(); }

absl::Status CopyGuarded(const CopySide& dst, const CopySide& src, uint64_t length,
                         DeviceCopies& gpu) {
  if (length == 0) return absl::OkStatus();
  const bool src_gpu = src.kind == MemoryKind::kCuda;
  const bool dst_gpu = dst.kind == MemoryKind::kCuda;
  if (!src_gpu && !dst_gpu) return GuardedMove(dst.data, src.data, length);
  if (src_gpu && dst_gpu) return gpu.DeviceToDevice(src.device, dst.data, src.data, length);
  if (dst_gpu) {
    // Host -> device: each chunk copied out of the host range under the guard, into the pinned
    // buffer, which only CUDA reads afterwards.
    return gpu.ToDevice(dst.device, dst.data, length,
                        [&](uint8_t* chunk, uint64_t offset, uint64_t bytes) {
                          return GuardedMove(chunk, src.data + offset, bytes);
                        });
  }
  return gpu.FromDevice(src.device, src.data, length,
                        [&](const uint8_t* chunk, uint64_t offset, uint64_t bytes) {
                          return GuardedMove(dst.data + offset, chunk, bytes);
                        });
}

}  // namespace wb::transport::local
