#include "common/gpu/device_health.h"

#include <map>
#include <mutex>

#include "spdlog/spdlog.h"

#ifdef WB_HAVE_CUDA
#include <cuda.h>
#include <driver_types.h>
#endif

namespace wb::gpu {
namespace {

// cudaError_t values (driver_types.h); checked against the headers where the build has them.
constexpr int kEccUncorrectable = 214;
constexpr int kIllegalAddress = 700;
constexpr int kLaunchTimeout = 702;
constexpr int kAssert = 710;
constexpr int kHardwareStackError = 714;
constexpr int kIllegalInstruction = 715;
constexpr int kMisalignedAddress = 716;
constexpr int kInvalidAddressSpace = 717;
constexpr int kInvalidPc = 718;
constexpr int kLaunchFailure = 719;
constexpr int kContextIsDestroyed = 709;

#ifdef WB_HAVE_CUDA
static_assert(cudaErrorECCUncorrectable == kEccUncorrectable, "driver_types.h changed");
static_assert(cudaErrorIllegalAddress == kIllegalAddress, "driver_types.h changed");
static_assert(cudaErrorLaunchTimeout == kLaunchTimeout, "driver_types.h changed");
static_assert(cudaErrorAssert == kAssert, "driver_types.h changed");
static_assert(cudaErrorHardwareStackError == kHardwareStackError, "driver_types.h changed");
static_assert(cudaErrorIllegalInstruction == kIllegalInstruction, "driver_types.h changed");
static_assert(cudaErrorMisalignedAddress == kMisalignedAddress, "driver_types.h changed");
static_assert(cudaErrorInvalidAddressSpace == kInvalidAddressSpace, "driver_types.h changed");
static_assert(cudaErrorInvalidPc == kInvalidPc, "driver_types.h changed");
static_assert(cudaErrorLaunchFailure == kLaunchFailure, "driver_types.h changed");
static_assert(cudaErrorContextIsDestroyed == kContextIsDestroyed, "driver_types.h changed");
static_assert(CUDA_ERROR_ILLEGAL_ADDRESS == kIllegalAddress, "cuda.h changed");
static_assert(CUDA_ERROR_LAUNCH_FAILED == kLaunchFailure, "cuda.h changed");
static_assert(CUDA_ERROR_ECC_UNCORRECTABLE == kEccUncorrectable, "cuda.h changed");
#endif

std::mutex mu;
std::map<int, std::string>& Marks() {
  static auto* marks = new std::map<int, std::string>;
  return *marks;
}

}  // namespace

bool IsStickyCudaError(int code) {
  switch (code) {
    case kEccUncorrectable:
    case kIllegalAddress:
    case kLaunchTimeout:
    case kAssert:
    case kHardwareStackError:
    case kIllegalInstruction:
    case kMisalignedAddress:
    case kInvalidAddressSpace:
    case kInvalidPc:
    case kLaunchFailure:
    case kContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

bool NoteCudaError(int device, int code, const std::string& what) {
  if (!IsStickyCudaError(code)) return false;
  MarkDeviceUnusable(device, what + " (CUDA error " + std::to_string(code) + ")");
  return true;
}

void MarkDeviceUnusable(int device, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = Marks().emplace(device, why);
  if (inserted) {
    spdlog::error(
        "cuda:{} is unusable for the rest of this process: {}; the agent stops offering it "
        "(restart the agent to use it again)",
        device, why);
  }
}

std::string DeviceUnusableReason(int device) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = Marks().find(device);
  if (it == Marks().end()) return "";
  return "cuda:" + std::to_string(device) + " is unusable after a fatal CUDA error (" + it->second +
         "); restart the agent to use it again";
}

void ResetDeviceHealthForTest() {
  std::lock_guard<std::mutex> lock(mu);
  Marks().clear();
}

}  // namespace wb::gpu
