// ProbeGpus with the CUDA runtime.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/cuda_probe.h"

namespace wb::gpu {

GpuProbe ProbeGpus() {
  GpuProbe probe;
  cudaDriverGetVersion(&probe.driver_cuda_version);
  cudaRuntimeGetVersion(&probe.runtime_cuda_version);
  cudaGetLastError();
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();  // do not leave the error behind for the next runtime call
    probe.unavailable_reason =
        err == cudaSuccess
            ? "no CUDA device"
            : absl::StrCat("no CUDA device (cudaGetDeviceCount: ", cudaGetErrorString(err), ")");
    return probe;
  }
  for (int i = 0; i < count; ++i) {
    weightbeam::v1::GpuInfo info;
    info.set_index(i);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      info.set_name(prop.name);
      info.set_memory_bytes(prop.totalGlobalMem);
    }
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), i) == cudaSuccess) {
      info.set_pci_bus_id(bus_id);
    }
    cudaGetLastError();
    probe.gpus.push_back(std::move(info));
  }
  return probe;
}

}  // namespace wb::gpu
