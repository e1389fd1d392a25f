// GPU staging with the CUDA runtime: pinned buffers from cudaHostAlloc, and per device a
// non-blocking stream with one event per buffer (the CopyEngine of staging_pipeline.h).
#include <cuda_runtime_api.h>

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gpu/device_health.h"
#include "daemon/gpu/device_memory.h"
#include "daemon/gpu/staging.h"

namespace wb::gpu {
namespace {

// `device`: the device the failed call ran on (-1: none), marked unusable when the error is
// sticky.
absl::Status CudaError(cudaError_t err, const std::string& what, int device = -1) {
  cudaGetLastError();  // do not leave the error behind for the next runtime call
  const std::string text = absl::StrCat("GPU staging: ", what, ": ", cudaGetErrorName(err), " (",
                                        cudaGetErrorString(err), ")");
  if (device >= 0) NoteCudaError(device, err, text);
  return absl::InternalError(text);
}

// Sets `device` current on this thread. Every runtime call that needs a context must follow
// one: a thread that never set its device would create (and keep) a context on GPU 0.
absl::Status UseDevice(int device) {
  if (std::string why = DeviceUnusableReason(device); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("GPU staging: ", why));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return CudaError(e, absl::StrCat("cudaSetDevice(", device, ")"), device);
  }
  return absl::OkStatus();
}

// Pinned host memory, freed with the device it was allocated under current (cudaFreeHost on a
// thread without a current device would create a context on GPU 0).
struct PinnedBuffer {
  uint8_t* data = nullptr;
  int device = -1;
  ~PinnedBuffer() {
    if (data == nullptr) return;
    if (device >= 0) cudaSetDevice(device);
    cudaFreeHost(data);
  }
};

// One device's stream and events; the pinned ring belongs to CudaStaging (portable memory).
class DeviceEngine : public CopyEngine {
 public:
  DeviceEngine(const StagingOptions& options, std::vector<uint8_t*> buffers, int device)
      : options_(options), buffers_(std::move(buffers)), device_(device) {}
  ~DeviceEngine() override {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaError(e, absl::StrCat("cudaStreamCreate on cuda:", device_), device_);
    }
    // Blocking-sync events: a wait sleeps in the driver instead of spinning a CPU core (one per
    // tcp connection thread). The last one marks the end of the stream's work (WaitAll).
    events_.resize(buffers_.size() + 1, nullptr);
    for (auto& ev : events_) {
      if (cudaError_t e =
              cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync);
          e != cudaSuccess) {
        return CudaError(e, absl::StrCat("cudaEventCreate on cuda:", device_), device_);
      }
    }
    return absl::OkStatus();
  }

  const StagingOptions& options() const override { return options_; }
  uint8_t* buffer(int index) override { return buffers_[index]; }

  absl::Status EnqueueToHost(int buffer, const uint8_t* device_src, uint64_t bytes) override {
    if (cudaError_t e =
            cudaMemcpyAsync(buffers_[buffer], device_src, bytes, cudaMemcpyDeviceToHost, stream_);
        e != cudaSuccess) {
      return CudaError(
          e, absl::StrCat("device -> pinned copy of ", bytes, " bytes on cuda:", device_), device_);
    }
    return Record(buffer);
  }
  absl::Status EnqueueToDevice(uint8_t* device_dst, int buffer, uint64_t bytes) override {
    if (cudaError_t e =
            cudaMemcpyAsync(device_dst, buffers_[buffer], bytes, cudaMemcpyHostToDevice, stream_);
        e != cudaSuccess) {
      return CudaError(
          e, absl::StrCat("pinned -> device copy of ", bytes, " bytes on cuda:", device_), device_);
    }
    return Record(buffer);
  }
  absl::Status WaitBuffer(int buffer) override {
    if (cudaError_t e = cudaEventSynchronize(events_[buffer]); e != cudaSuccess) {
      return CudaError(e, absl::StrCat("waiting for a staged copy on cuda:", device_), device_);
    }
    return absl::OkStatus();
  }
  // Not cudaStreamSynchronize: without cudaDeviceScheduleBlockingSync it spins; an event
  // recorded at the end of the stream with cudaEventBlockingSync sleeps.
  absl::Status WaitAll() override {
    const int last = static_cast<int>(buffers_.size());
    if (auto s = Record(last); !s.ok()) {
      // Still wait for what was enqueued (no copy may outlive its buffers), the spinning way.
      cudaStreamSynchronize(stream_);
      cudaGetLastError();
      return s;
    }
    return WaitBuffer(last);
  }

 private:
  absl::Status Record(int buffer) {
    if (cudaError_t e = cudaEventRecord(events_[buffer], stream_); e != cudaSuccess) {
      return CudaError(e, absl::StrCat("cudaEventRecord on cuda:", device_), device_);
    }
    return absl::OkStatus();
  }

  StagingOptions options_;
  std::vector<uint8_t*> buffers_;
  int device_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

class CudaStaging : public DeviceStaging {
 public:
  explicit CudaStaging(const StagingOptions& options) : options_(options) {}
  // Engines first: their streams must be idle before the pinned buffers go.
  ~CudaStaging() override { engines_.clear(); }

  // The pinned ring is allocated on first use, under the first device used (cudaHostAlloc
  // needs a current context; allocating at creation would make one on GPU 0). Portable: every
  // device's engine uses it.
  absl::Status AllocatePinned(int device) {
    if (!pinned_.empty()) return absl::OkStatus();
    std::vector<PinnedBuffer> ring(options_.depth);
    for (auto& b : ring) {
      void* p = nullptr;
      if (cudaError_t e = cudaHostAlloc(&p, options_.chunk_bytes, cudaHostAllocPortable);
          e != cudaSuccess) {
        return CudaError(
            e, absl::StrCat("cudaHostAlloc of ", options_.chunk_bytes, " bytes on cuda:", device),
            device);
      }
      b.data = static_cast<uint8_t*>(p);
      b.device = device;
    }
    pinned_ = std::move(ring);
    return absl::OkStatus();
  }

  absl::Status ReadFromDevice(int device, const uint8_t* src, uint64_t length,
                              const ChunkSink& sink) override {
    auto engine = EngineFor(device);
    if (!engine.ok()) return engine.status();
    return StageFromDevice(**engine, src, length, sink);
  }
  absl::Status WriteToDevice(int device, uint8_t* dst, uint64_t length,
                             const ChunkSource& source) override {
    auto engine = EngineFor(device);
    if (!engine.ok()) return engine.status();
    return StageToDevice(**engine, dst, length, source);
  }
  const StagingOptions& options() const override { return options_; }

 private:
  absl::StatusOr<DeviceEngine*> EngineFor(int device) {
    if (auto s = UseDevice(device); !s.ok()) return s;
    if (auto s = AllocatePinned(device); !s.ok()) return s;
    auto it = engines_.find(device);
    if (it != engines_.end()) return it->second.get();
    std::vector<uint8_t*> buffers;
    for (auto& b : pinned_) buffers.push_back(b.data);
    auto engine = std::make_unique<DeviceEngine>(options_, std::move(buffers), device);
    if (auto s = engine->Init(); !s.ok()) return s;
    return (engines_[device] = std::move(engine)).get();
  }

  StagingOptions options_;
  std::vector<PinnedBuffer> pinned_;
  std::map<int, std::unique_ptr<DeviceEngine>> engines_;
};

}  // namespace

absl::Status StagingAvailable() { return CudaAvailable(); }

absl::Status CheckDeviceRange(const void* ptr, uint64_t length, int device) {
  if (auto s = CudaAvailable(); !s.ok()) return s;
  if (auto s = UseDevice(device); !s.ok()) return s;
  cudaPointerAttributes attr{};
  if (cudaError_t e = cudaPointerGetAttributes(&attr, ptr); e != cudaSuccess) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU memory: pointer ", reinterpret_cast<uintptr_t>(ptr),
                     " is not known to CUDA (", cudaGetErrorString(e), ")"));
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU memory: pointer ", reinterpret_cast<uintptr_t>(ptr), " is ",
                     attr.type == cudaMemoryTypeHost ? "pinned host memory" : "not device memory",
                     ", registered as cuda:", device));
  }
  if (attr.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU memory: pointer ", reinterpret_cast<uintptr_t>(ptr),
                     " is on cuda:", attr.device, ", registered as cuda:", device));
  }
  // The end of the range must belong to the same kind of memory (a cheap bound check: CUDA
  // cannot say how long an allocation is through this call).
  if (length > 1) {
    cudaPointerAttributes end{};
    const auto* last = static_cast<const uint8_t*>(ptr) + (length - 1);
    if (cudaPointerGetAttributes(&end, last) != cudaSuccess || end.type != attr.type ||
        end.device != device) {
      cudaGetLastError();
      return absl::InvalidArgumentError(absl::StrCat("GPU memory: ", length, " bytes from ",
                                                     reinterpret_cast<uintptr_t>(ptr),
                                                     " run past the device allocation"));
    }
  }
  return absl::OkStatus();
}

absl::Status CopyAnyToAny(void* dst, const void* src, uint64_t bytes, int device) {
  if (bytes == 0) return absl::OkStatus();
  if (auto s = UseDevice(device); !s.ok()) return s;
  // cudaMemcpy may return before a device -> device copy has finished (issue 41, item 1), and
  // callers tell other processes the bytes are in place (step_captured, commit(v), a restored
  // mirror) the moment this returns. The copy runs on this thread's per-thread stream (a
  // blocking stream: ordered after legacy default-stream work) and is waited for on it.
  const cudaStream_t stream = cudaStreamPerThread;
  if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
      e != cudaSuccess) {
    return CudaError(e, absl::StrCat("copy of ", bytes, " bytes on cuda:", device), device);
  }
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return CudaError(e, absl::StrCat("waiting for a copy of ", bytes, " bytes on cuda:", device),
                     device);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceStaging>> DeviceStaging::Create(
    const StagingOptions& options) {
  if (auto s = ValidateStagingOptions(options); !s.ok()) return s;
  if (auto s = CudaAvailable(); !s.ok()) return s;
  auto staging = std::make_unique<CudaStaging>(options);
  return std::unique_ptr<DeviceStaging>(std::move(staging));
}

}  // namespace wb::gpu
