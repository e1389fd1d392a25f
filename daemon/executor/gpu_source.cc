#include "daemon/executor/gpu_source.h"

#include <new>

#include "absl/strings/str_cat.h"
#include "common/tensor/dtype.h"
#include "daemon/gpu/staging.h"

namespace wb::executor {

namespace v1 = weightbeam::v1;

DeltaPath ChooseDeltaPath(bool needs_transform, bool contiguous, const transport::MemoryRef& src) {
  if (needs_transform || !contiguous) return DeltaPath::kStaged;
  return IsDeviceSource(src) ? DeltaPath::kDeviceInPlace : DeltaPath::kHostInPlace;
}

uint64_t SourceSpanBytes(const v1::TransferOp& op) {
  if (op.rows() == 0) return 0;
  const uint64_t row = op.row_elems() * tensor::DTypeBytes(op.src_dtype());
  const uint64_t stride = op.src_stride() ? op.src_stride() : row;
  return (op.rows() - 1) * stride + row;
}

absl::StatusOr<HostSourceRows> HostSourceRows::Read(const v1::TransferOp& op,
                                                    const registry::RegisteredTensor& source) {
  HostSourceRows rows;
  rows.original_ = &op;
  if (!IsDeviceSource(source.memory)) {
    rows.base_ = static_cast<const uint8_t*>(source.memory.addr);
    return rows;
  }
  const int device = source.memory.device;
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(),
                        absl::StrCat("source tensor '", source.spec.name(), "' on cuda:", device,
                                     ": copying its rows to the host: ", s.message()));
  };
  const uint64_t span = SourceSpanBytes(op);
  const auto* src = static_cast<const uint8_t*>(source.memory.addr) + op.src_offset();
  // Checked first: on a machine with a device, a range that is not device memory of the
  // registered device must fail here, never be read as something else.
  if (auto s = gpu::CheckDeviceRange(src, span, device); !s.ok()) return fail(s);
  rows.copy_.reset(new (std::nothrow) uint8_t[span]);
  if (!rows.copy_) {
    return fail(absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", span, " bytes")));
  }
  if (auto s = gpu::CopyAnyToAny(rows.copy_.get(), src, span, device); !s.ok()) return fail(s);
  rows.rebased_ = std::make_unique<v1::TransferOp>(op);
  rows.rebased_->set_src_offset(0);
  rows.base_ = rows.copy_.get();
  return rows;
}

}  // namespace wb::executor
