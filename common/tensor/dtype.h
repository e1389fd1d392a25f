// The dtypes weightbeam moves, one row each: element size, the name in messages and the
// safetensors name. Keyed by weightbeam.v1.DType's values but free of protobuf, so the
// transforms (which build without it) read the same table as the registry, planner and storage.
#pragma once

#include <string>

namespace wb::tensor {

struct DTypeFacts {
  int value;                // weightbeam.v1.DType
  int bytes;                // per element
  const char* name;         // in messages and plans: "bf16"
  const char* safetensors;  // in safetensors headers: "BF16"
};

inline constexpr DTypeFacts kDTypes[] = {
    {1, 4, "f32", "F32"},         {2, 2, "f16", "F16"}, {3, 2, "bf16", "BF16"},
    {4, 1, "f8_e4m3", "F8_E4M3"}, {5, 4, "i32", "I32"}, {6, 8, "i64", "I64"},
    {7, 1, "u8", "U8"},
};

// The row of dtype `value`; nullptr for DTYPE_UNSPECIFIED and unknown values.
constexpr const DTypeFacts* FindDType(int value) {
  for (const DTypeFacts& d : kDTypes) {
    if (d.value == value) return &d;
  }
  return nullptr;
}

// Bytes per element; 0 for DTYPE_UNSPECIFIED and unknown values.
constexpr int DTypeBytes(int value) {
  const DTypeFacts* d = FindDType(value);
  return d == nullptr ? 0 : d->bytes;
}

// "bf16"; "unspecified" for DTYPE_UNSPECIFIED, "unknown dtype <value>" for unknown values.
std::string DTypeName(int value);

// "BF16"; empty for dtypes safetensors files of weightbeam do not hold.
std::string SafetensorsDTypeName(int value);

}  // namespace wb::tensor
