// Stand-in for the CUDA delta encoder in builds without the CUDA toolkit.
#include "daemon/delta/gpu_encode.h"

namespace wb::delta::cuda {
namespace {

EncodeCode NoCuda(std::string* error) {
  *error = "built without CUDA";
  return EncodeCode::kBuiltWithoutCuda;
}

}  // namespace

DeviceEncoder::~DeviceEncoder() = default;

EncodeCode DeviceEncoder::CountChanges(const uint8_t*, const uint8_t*, uint64_t, int, ChangeCounts*,
                                       std::string* error) {
  return NoCuda(error);
}
EncodeCode DeviceEncoder::WriteRecords(uint8_t*, const uint8_t*, uint64_t, int, uint64_t, int,
                                       uint8_t*, uint8_t*, std::string* error) {
  return NoCuda(error);
}
EncodeCode DeviceEncoder::RefreshShadow(uint8_t*, const uint8_t*, uint64_t, std::string* error) {
  return NoCuda(error);
}
EncodeCode DeviceEncoder::AllocateShadow(uint64_t, bool, void**, std::string* error) {
  return NoCuda(error);
}
void DeviceEncoder::FreeShadow(void*, bool, int) {}
EncodeCode DeviceEncoder::Copy(void*, const void*, uint64_t, std::string* error) {
  return NoCuda(error);
}
EncodeCode DeviceEncoder::Prepare(std::string* error) { return NoCuda(error); }
EncodeCode DeviceEncoder::EnsureScratch(void**, uint64_t*, uint64_t, const char*,
                                        std::string* error) {
  return NoCuda(error);
}

}  // namespace wb::delta::cuda
