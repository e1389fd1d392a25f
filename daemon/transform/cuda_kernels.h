// Launchers of the transform kernels, with a plain (absl-free) interface so that nvcc never
// sees absl; transform_cuda.cc wraps them into absl::Status. The no-CUDA build links
// cuda_kernels_nocuda.cc instead, which reports kBuiltWithoutCuda.
#pragma once

#include <string>

#include "daemon/transform/transform_types.h"

namespace wb::transform::cuda {

enum class LaunchCode { kOk, kBuiltWithoutCuda, kNoDevice, kCudaError };

// `desc` is validated with strides filled in. Enqueues on `stream` (cudaStream_t) and returns
// without waiting; on failure `error` says what went wrong.
LaunchCode LaunchTransform(const TransformDesc& desc, const void* src, void* dst, float* scales,
                           void* stream, std::string* error);

}  // namespace wb::transform::cuda
