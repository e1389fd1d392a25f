// Stand-in for the CUDA scatter in builds without the CUDA toolkit.
#include "daemon/delta/gpu_scatter.h"

namespace wb::delta::cuda {

struct DeviceScatter::State {};

DeviceScatter::~DeviceScatter() = default;

ScatterCode DeviceScatter::Scatter(int, void*, const uint64_t*, const uint8_t*, uint64_t, int,
                                   std::string* error) {
  *error = "built without CUDA";
  return ScatterCode::kBuiltWithoutCuda;
}

ScatterCode DeviceScatter::CopyToHost(int, void*, const void*, uint64_t, std::string* error) {
  *error = "built without CUDA";
  return ScatterCode::kBuiltWithoutCuda;
}

}  // namespace wb::delta::cuda
