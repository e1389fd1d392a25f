// Delta mode on GPU sources: EncodeDelta (delta_codec.h) with the new version in device memory
// and the shadow on the same device (default) or in mapped pinned host memory. The packed bytes
// are identical to the CPU codec's for the same inputs; only the packed records cross to the
// host. Errors name the device and the CUDA call; without CUDA every call says why.
//
// Shadow placement (not measured: no GPU has run this yet; ./wb gpu-check times both):
//   device  reads 2 x bytes at HBM speed (H100: ~3 TB/s, well under a millisecond per GB)
//           and costs GPU memory equal to the weights being sent.
//   host    costs no GPU memory, but every compare reads the whole shadow across PCIe
//           (~25-50 GB/s): tens of milliseconds per GB, still ~10x the CPU codec per thread.
// Device is the default because the encoder exists to keep delta mode off the step's critical
// path; agents short of GPU memory choose kHostMapped.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/delta/delta_codec.h"
#include "daemon/delta/gpu_encode.h"

namespace wb::delta {

// Ok when deltas can be encoded on a GPU here; else FailedPrecondition with the reason.
absl::Status GpuEncodeAvailable();

enum class ShadowPlacement { kDevice, kHostMapped };

// The previous version of one buffer, readable by the encoder's kernels. Move-only.
class GpuShadow {
 public:
  static absl::StatusOr<GpuShadow> Allocate(cuda::DeviceEncoder& encoder, uint64_t bytes,
                                            ShadowPlacement placement);
  GpuShadow() = default;
  GpuShadow(GpuShadow&& other) noexcept { *this = std::move(other); }
  GpuShadow& operator=(GpuShadow&& other) noexcept;
  GpuShadow(const GpuShadow&) = delete;
  GpuShadow& operator=(const GpuShadow&) = delete;
  ~GpuShadow() {
    cuda::DeviceEncoder::FreeShadow(data_, placement_ == ShadowPlacement::kHostMapped, device_);
  }

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  ShadowPlacement placement() const { return placement_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  ShadowPlacement placement_ = ShadowPlacement::kDevice;
  int device_ = 0;
};

class GpuDeltaEncoder {
 public:
  explicit GpuDeltaEncoder(int device) : encoder_(device) {}

  cuda::DeviceEncoder& device_encoder() { return encoder_; }

  // Seeds the shadow (an anchor step): copies `bytes` bytes from `src` (device or host).
  absl::Status Seed(GpuShadow& shadow, const void* src, uint64_t bytes);

  // EncodeDelta with `next` in device memory: the same kind, packed bytes and changed_elems as
  // the CPU codec (dense: the exact count, which is also the CPU's lower bound), and the shadow
  // equal to `next` afterwards. Aborted when `next` changed while it was read (the two kernel
  // passes disagree): the shadow is then torn and must be seeded again before the next Encode.
  absl::StatusOr<DeltaEncoding> Encode(GpuShadow& shadow, const uint8_t* next, uint64_t bytes,
                                       int elem_size);

 private:
  cuda::DeviceEncoder encoder_;
};

}  // namespace wb::delta
