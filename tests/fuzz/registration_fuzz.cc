// libFuzzer target for registration requests (common/tensor/tensor_checks.h): a TensorSpec and
// a byte length from the input, as a local process would send them. An accepted spec must need
// exactly `length` bytes, computed here in 128-bit arithmetic (no wrap-around can sneak through),
// and the agent then touches those bytes: the harness reads and writes all of them in a buffer
// of that length, so ASan sees any access the numbers would let through.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/tensor/dtype.h"
#include "common/tensor/tensor_checks.h"
#include "tests/fuzz/fuzz_check.h"
#include "weightbeam/v1/local.pb.h"

namespace {
constexpr char kTarget[] = "registration_fuzz";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weightbeam::v1::TensorRegistration reg;
  if (!reg.ParseFromArray(data, static_cast<int>(size))) return 0;
  const uint64_t length = reg.memory().host_shm().length();
  if (!wb::registry::ValidateTensorSpec(reg.spec(), length).ok()) return 0;
  unsigned __int128 need = wb::tensor::DTypeBytes(reg.spec().dtype());
  if (reg.spec().shard_size() == 0) {
    for (int64_t d : reg.spec().global_shape()) need *= static_cast<uint64_t>(d);
  } else {
    for (const auto& s : reg.spec().shard()) need *= static_cast<uint64_t>(s.size());
  }
  if (need != length) wb::fuzz::Fail(kTarget, "accepted spec does not need exactly `length` bytes");
  if (length <= (1 << 20)) {
    std::vector<uint8_t> memory(length);
    for (uint64_t i = 0; i < length; ++i) memory[i] = static_cast<uint8_t>(i);
  }
  return 0;
}
