// ProbeGpus in builds without the CUDA toolkit.
#include "daemon/gpu/cuda_probe.h"

namespace wb::gpu {

GpuProbe ProbeGpus() {
  GpuProbe probe;
  probe.unavailable_reason = "built without CUDA";
  return probe;
}

}  // namespace wb::gpu
