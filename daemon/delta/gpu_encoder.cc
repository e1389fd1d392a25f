#include "daemon/delta/gpu_encoder.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/device_memory.h"

namespace wb::delta {
namespace {

absl::Status FromCode(cuda::EncodeCode code, const std::string& error, int device) {
  switch (code) {
    case cuda::EncodeCode::kOk:
      return absl::OkStatus();
    case cuda::EncodeCode::kBuiltWithoutCuda:
      return absl::FailedPreconditionError(
          absl::StrCat("delta encode on cuda:", device, ": ", error));
    case cuda::EncodeCode::kSourceChanged:
      return absl::AbortedError(absl::StrCat("delta encode on cuda:", device, ": ", error));
    default:
      return absl::InternalError(absl::StrCat("delta encode on cuda:", device, ": ", error));
  }
}

}  // namespace

absl::Status GpuEncodeAvailable() {
  // device_memory is itself the CUDA or the stand-in build, as the encoder is.
  return gpu::CudaAvailable();
}

GpuShadow& GpuShadow::operator=(GpuShadow&& other) noexcept {
  if (this != &other) {
    cuda::DeviceEncoder::FreeShadow(data_, placement_ == ShadowPlacement::kHostMapped, device_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    placement_ = other.placement_;
    device_ = other.device_;
  }
  return *this;
}

absl::StatusOr<GpuShadow> GpuShadow::Allocate(cuda::DeviceEncoder& encoder, uint64_t bytes,
                                              ShadowPlacement placement) {
  std::string error;
  void* p = nullptr;
  const bool host = placement == ShadowPlacement::kHostMapped;
  if (auto code = encoder.AllocateShadow(bytes, host, &p, &error); code != cuda::EncodeCode::kOk) {
    return FromCode(code, error, encoder.device());
  }
  GpuShadow shadow;
  shadow.data_ = static_cast<uint8_t*>(p);
  shadow.size_ = bytes;
  shadow.placement_ = placement;
  shadow.device_ = encoder.device();
  return shadow;
}

absl::Status GpuDeltaEncoder::Seed(GpuShadow& shadow, const void* src, uint64_t bytes) {
  if (bytes != shadow.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: shadow has ", shadow.size(), " bytes but the seed ", bytes));
  }
  std::string error;
  return FromCode(encoder_.Copy(shadow.data(), src, bytes, &error), error, encoder_.device());
}

absl::StatusOr<DeltaEncoding> GpuDeltaEncoder::Encode(GpuShadow& shadow, const uint8_t* next,
                                                      uint64_t bytes, int elem_size) {
  // The same argument checks and messages as the CPU codec.
  if (elem_size != 1 && elem_size != 2 && elem_size != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: element size ", elem_size, " is not 1, 2 or 4 bytes"));
  }
  if (shadow.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: shadow has ", shadow.size(), " bytes but the new version ", bytes));
  }
  if (bytes % elem_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta: ", bytes, " bytes is not a whole number of ", elem_size, "-byte elements"));
  }
  const int device = encoder_.device();
  std::string error;
  cuda::ChangeCounts counts;
  if (auto code = encoder_.CountChanges(shadow.data(), next, bytes, elem_size, &counts, &error);
      code != cuda::EncodeCode::kOk) {
    return FromCode(code, error, device);
  }
  DeltaHeader h;
  h.elem_size = elem_size;
  h.index_width = DeltaIndexWidth(counts.max_gap);
  h.total_elems = bytes / elem_size;
  h.count = counts.count;
  DeltaEncoding result;
  result.changed_elems = counts.count;
  // The CPU codec's rule: packed only when strictly smaller than the buffer itself.
  if (PackedDeltaBytes(h) >= bytes) {
    result.kind = DeltaEncoding::Kind::kDense;
    if (auto code = encoder_.RefreshShadow(shadow.data(), next, bytes, &error);
        code != cuda::EncodeCode::kOk) {
      return FromCode(code, error, device);
    }
    return result;
  }
  result.packed.resize(PackedDeltaBytes(h));
  WriteDeltaHeader(h, result.packed.data());
  uint8_t* gaps = result.packed.data() + kDeltaHeaderBytes;
  uint8_t* values = gaps + h.count * h.index_width;
  if (auto code = encoder_.WriteRecords(shadow.data(), next, bytes, elem_size, h.count,
                                        h.index_width, gaps, values, &error);
      code != cuda::EncodeCode::kOk) {
    return FromCode(code, error, device);
  }
  return result;
}

}  // namespace wb::delta
