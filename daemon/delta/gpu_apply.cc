#include "daemon/delta/gpu_apply.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/device_memory.h"

namespace wb::delta {

namespace {

absl::Status CudaStatus(cuda::ScatterCode code, const std::string& error, absl::string_view what,
                        absl::string_view tensor) {
  const std::string msg = absl::StrCat(what, " of tensor '", tensor, "': ", error);
  if (code == cuda::ScatterCode::kBuiltWithoutCuda) return absl::UnimplementedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

absl::Status GpuScatterAvailable() { return gpu::CudaAvailable(); }

absl::Status GpuApplier::Scatter(const ScatterList& list, const DestinationMemory& dst,
                                 const DestinationMemory& scales, absl::string_view tensor) {
  const size_t e = static_cast<size_t>(list.elem_size);
  struct Part {
    const std::vector<uint64_t>& offsets;
    const std::vector<uint8_t>& values;
    const DestinationMemory& memory;
    const char* what;
  };
  const Part parts[2] = {
      {list.data_offsets, list.data_values, dst, "scattering a delta"},
      {list.scale_offsets, list.scale_values, scales, "scattering a delta into the scales"}};
  for (const Part& p : parts) {
    if (p.offsets.empty()) continue;
    if (!p.memory.on_device) {
      for (size_t i = 0; i < p.offsets.size(); ++i) {
        std::memcpy(p.memory.addr + p.offsets[i], p.values.data() + i * e, e);
      }
      continue;
    }
    std::string error;
    const cuda::ScatterCode code =
        scatter_.Scatter(p.memory.device, p.memory.addr, p.offsets.data(), p.values.data(),
                         p.offsets.size(), list.elem_size, &error);
    if (code != cuda::ScatterCode::kOk) return CudaStatus(code, error, p.what, tensor);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> GpuApplier::Hash(const OpLayout& layout, const DestinationMemory& dst,
                                          const DestinationMemory& scales,
                                          absl::string_view tensor) {
  // The landed bytes back in flat order, so that HashFlat equals HashDestination.
  std::vector<uint8_t> flat(layout.flat_bytes);
  for (const Segment& s : layout.segments) {
    const DestinationMemory& m = s.scales ? scales : dst;
    if (!m.on_device) {
      std::memcpy(flat.data() + s.flat_offset, m.addr + s.dst_offset, s.length);
      continue;
    }
    std::string error;
    const cuda::ScatterCode code = scatter_.CopyToHost(m.device, flat.data() + s.flat_offset,
                                                       m.addr + s.dst_offset, s.length, &error);
    if (code != cuda::ScatterCode::kOk) {
      return CudaStatus(code, error, "copying back for verification", tensor);
    }
  }
  return HashFlat(layout, flat.data());
}

}  // namespace wb::delta
