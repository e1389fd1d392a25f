// Devices whose CUDA context is gone for good. After a "sticky" error (an illegal address, a
// kernel assert, a launch failure, an uncorrectable ECC error, ...) every later CUDA call in this
// process on that device fails; the context cannot be reset without ending the process. The
// code that hits one marks the device unusable here, and the agent stops offering the device
// (registrations, staging, delta encode and scatter on it fail at once with the first error and
// "restart the agent") instead of failing each later call with an unrelated-looking message.
//
// Plain C++ (no absl, no CUDA headers), so that .cu files can use it too.
#pragma once

#include <string>

namespace wb::gpu {

// True for the cudaError_t / CUresult codes after which the device's context is unusable.
// (The runtime's and the driver's codes agree for these.)
bool IsStickyCudaError(int code);

// Records that `device` hit sticky error `code` while doing `what` (the first one is kept and
// logged). Returns true when `code` is sticky (and the device is now marked).
bool NoteCudaError(int device, int code, const std::string& what);

// Marks `device` unusable with `why` (the first reason is kept).
void MarkDeviceUnusable(int device, const std::string& why);

// Empty when `device` is usable; else why not, ending in what to do about it.
std::string DeviceUnusableReason(int device);

// For tests: forget every mark.
void ResetDeviceHealthForTest();

}  // namespace wb::gpu
