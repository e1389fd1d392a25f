// What GPUs this host has (count, names, PCI bus ids, memory) for the agent's AgentInfo.
// Never fails: without the CUDA toolkit at build time, or without a driver or device at run
// time, the list is empty and `unavailable_reason` says why.
#pragma once

#include <string>
#include <vector>

#include "weightbeam/v1/types.pb.h"

namespace wb::gpu {

struct GpuProbe {
  std::vector<weightbeam::v1::GpuInfo> gpus;
  // Empty when `gpus` could be listed; else "built without CUDA" or "no CUDA device (...)".
  std::string unavailable_reason;
  // The newest CUDA version the installed driver supports (cudaDriverGetVersion, 0: no driver)
  // and the runtime this build links (cudaRuntimeGetVersion), as 1000 * major + 10 * minor.
  int driver_cuda_version = 0;
  int runtime_cuda_version = 0;
};

GpuProbe ProbeGpus();

}  // namespace wb::gpu
