// Stand-in for the CUDA kernels in builds without the CUDA toolkit.
#include "daemon/transform/cuda_kernels.h"

namespace wb::transform::cuda {

LaunchCode LaunchTransform(const TransformDesc&, const void*, void*, float*, void*,
                           std::string* error) {
  *error = "built without CUDA";
  return LaunchCode::kBuiltWithoutCuda;
}

}  // namespace wb::transform::cuda
