// The finiteness check's scan (daemon/checks/finite_check.h): every non-finite bit pattern of
// each float dtype is found at its index, and every finite extreme passes.
#include "daemon/checks/finite_check.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

namespace v1 = weightbeam::v1;
using wb::checks::FirstNonFinite;

namespace {

template <typename Bits>
void CheckDtype(v1::DType dtype, std::vector<Bits> finite, std::vector<Bits> non_finite) {
  // 10,000 elements: crosses the scan's blocks; finite extremes everywhere.
  std::vector<Bits> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = finite[i % finite.size()];
  CHECK_FALSE(FirstNonFinite(data.data(), data.size(), dtype).has_value());
  for (Bits bad : non_finite) {
    for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9999}}) {
      std::vector<Bits> d = data;
      d[at] = bad;
      d[9999 - at / 2] = bad;  // a later one too: the first is reported
      INFO(v1::DType_Name(dtype) << " bits " << uint64_t{bad} << " at " << at);
      auto hit = FirstNonFinite(d.data(), d.size(), dtype);
      REQUIRE(hit.has_value());
      CHECK(*hit == std::min(at, 9999 - at / 2));
    }
  }
}

}  // namespace

TEST_CASE("every NaN and Inf of BF16, F16, F32 and every e4m3fn NaN code is found") {
  // Largest finite, smallest subnormal, zero and negative zero, one.
  CheckDtype<uint16_t>(v1::DTYPE_BF16, {0x7f7f, 0xff7f, 0x0001, 0x0000, 0x8000, 0x3f80},
                       {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff});
  CheckDtype<uint16_t>(v1::DTYPE_F16, {0x7bff, 0xfbff, 0x0001, 0x8000, 0x3c00},
                       {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff});
  CheckDtype<uint32_t>(v1::DTYPE_F32, {0x7f7fffffu, 0xff7fffffu, 0x1u, 0x80000000u, 0x3f800000u},
                       {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu});
  // e4m3fn: 448 is 0x7e; 0x7f and 0xff are its only NaNs, it has no Inf.
  CheckDtype<uint8_t>(v1::DTYPE_F8_E4M3, {0x7e, 0xfe, 0x01, 0x00, 0x80, 0x38}, {0x7f, 0xff});
}

TEST_CASE("integer tensors have no non-finite values") {
  std::vector<uint32_t> ones(100, 0xffffffffu);
  CHECK_FALSE(FirstNonFinite(ones.data(), ones.size(), v1::DTYPE_I32).has_value());
  CHECK_FALSE(FirstNonFinite(ones.data(), ones.size(), v1::DTYPE_U8).has_value());
  CHECK_FALSE(FirstNonFinite(nullptr, 0, v1::DTYPE_BF16).has_value());
}
