#include "common/tensor/dtype.h"

namespace wb::tensor {

std::string DTypeName(int value) {
  if (const DTypeFacts* d = FindDType(value)) return d->name;
  if (value == 0) return "unspecified";
  return "unknown dtype " + std::to_string(value);
}

std::string SafetensorsDTypeName(int value) {
  const DTypeFacts* d = FindDType(value);
  return d == nullptr ? std::string() : d->safetensors;
}

}  // namespace wb::tensor
