// Sticky CUDA errors: which codes leave a device's context unusable, and that a device marked
// unusable is refused by the agent's GPU paths (here: transport registration of GPU memory,
// which runs the same check first in CUDA and no-CUDA builds) with the first error and what to
// do, while other devices stay usable.
#include "common/gpu/device_health.h"

#include <catch2/catch.hpp>
#include <string>

#include "daemon/transport/gpu_memory.h"

namespace wb::gpu {
namespace {

TEST_CASE("sticky CUDA errors are told apart from ordinary ones") {
  CHECK(IsStickyCudaError(700));   // cudaErrorIllegalAddress
  CHECK(IsStickyCudaError(719));   // cudaErrorLaunchFailure
  CHECK(IsStickyCudaError(710));   // cudaErrorAssert
  CHECK(IsStickyCudaError(214));   // cudaErrorECCUncorrectable
  CHECK(!IsStickyCudaError(0));    // cudaSuccess
  CHECK(!IsStickyCudaError(2));    // cudaErrorMemoryAllocation: the next call may succeed
  CHECK(!IsStickyCudaError(1));    // cudaErrorInvalidValue
  CHECK(!IsStickyCudaError(100));  // cudaErrorNoDevice
  CHECK(!IsStickyCudaError(701));  // cudaErrorLaunchOutOfResources: that launch only
}

TEST_CASE("a sticky error marks its device unusable, keeps the first reason, spares others") {
  ResetDeviceHealthForTest();
  CHECK(DeviceUnusableReason(1).empty());
  CHECK(!NoteCudaError(1, 2, "cudaMalloc"));  // out of memory: not sticky
  CHECK(DeviceUnusableReason(1).empty());
  CHECK(NoteCudaError(1, 700, "the delta write kernel"));
  CHECK(NoteCudaError(1, 719, "a later launch"));  // sticky too, but the first reason stays
  const std::string why = DeviceUnusableReason(1);
  CHECK(why.find("cuda:1 is unusable") != std::string::npos);
  CHECK(why.find("the delta write kernel") != std::string::npos);
  CHECK(why.find("a later launch") == std::string::npos);
  CHECK(why.find("restart the agent") != std::string::npos);
  CHECK(DeviceUnusableReason(0).empty());
  ResetDeviceHealthForTest();
  CHECK(DeviceUnusableReason(1).empty());
}

TEST_CASE("the transports refuse GPU memory of an unusable device, saying why") {
  ResetDeviceHealthForTest();
  MarkDeviceUnusable(3, "an illegal address in the scatter kernel");
  transport::MemoryRef mem;
  mem.kind = transport::MemoryKind::kCuda;
  mem.device = 3;
  static uint8_t bytes[64];
  mem.addr = bytes;
  mem.length = sizeof(bytes);
  const absl::Status s = transport::CheckGpuMemory("tcp", mem);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(s.message()).find("illegal address in the scatter kernel") !=
        std::string::npos);
  // Another device is refused for its own reason (no device, not built with CUDA, or not
  // device memory), never for device 3's.
  mem.device = 0;
  const absl::Status other = transport::CheckGpuMemory("tcp", mem);
  CHECK(!other.ok());
  CHECK(std::string(other.message()).find("unusable") == std::string::npos);
  ResetDeviceHealthForTest();
}

}  // namespace
}  // namespace wb::gpu
