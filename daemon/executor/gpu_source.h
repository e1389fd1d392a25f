// CUDA sources in the executor. Transforms (casts, FP8 block quantisation), strided gathers in
// delta mode and the delta compare of staged ops run on the CPU, so before that host work an op
// whose source is CUDA memory copies the rows it reads device -> host (one cudaMemcpy of the
// op's source span) and the host work runs unchanged on the copy. Contiguous copies need none
// of it: the transports write them from device memory themselves (tcp through pinned staging,
// local with the driver, rdma through dma-buf), and delta mode compares them on the device
// (DeltaSender::ProcessOnDevice).
//
// Why a host copy rather than the CUDA transform kernels: the executor's staging buffers, which
// every transport sends from, are host memory, so a device transform would copy its output
// device -> host anyway; copying the input instead keeps one transform code path (the CPU one
// every test checks bit for bit). It moves the source bytes over PCIe (BF16 -> FP8: twice the
// bytes of the result); to revisit with a GPU.
//
// The copy is plain host memory outside the staging watermark (a second watermark lease per op
// could deadlock two preparers against each other): at most prepare_threads x the largest
// source span of a transformed GPU-source op at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "daemon/registry/region_registry.h"
#include "daemon/transport/transport.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::executor {

// Whether host code may not dereference this memory (a CUDA region).
inline bool IsDeviceSource(const transport::MemoryRef& memory) {
  return memory.kind == transport::MemoryKind::kCuda;
}

// How delta mode handles one op.
enum class DeltaPath {
  kHostInPlace,    // a contiguous copy of host memory: the CPU codec reads the source
  kDeviceInPlace,  // a contiguous copy of CUDA memory: the GPU encoder reads the source
  kStaged,         // transformed or strided: staged on the host (CUDA rows copied first)
};
DeltaPath ChooseDeltaPath(bool needs_transform, bool contiguous, const transport::MemoryRef& src);

// Bytes an op reads from its source: from src_offset to the end of its last row (bounds
// already checked by CheckSourceOp).
uint64_t SourceSpanBytes(const weightbeam::v1::TransferOp& op);

// Where host code reads an op's source rows: the registered memory itself (host sources), or
// a host copy of the op's source span (CUDA sources) with the op rebased onto it (src_offset 0).
class HostSourceRows {
 public:
  // Copies the rows of a CUDA source. Errors name the tensor and its device:
  // FAILED_PRECONDITION "built without CUDA" or "no CUDA device (...)", INVALID_ARGUMENT when
  // the registered range is not device memory of that device.
  static absl::StatusOr<HostSourceRows> Read(const weightbeam::v1::TransferOp& op,
                                             const registry::RegisteredTensor& source);

  // The op to hand to host code together with base(): src_offset is relative to base().
  const weightbeam::v1::TransferOp& op() const { return rebased_ ? *rebased_ : *original_; }
  const uint8_t* base() const { return base_; }
  bool copied() const { return copy_ != nullptr; }

 private:
  const weightbeam::v1::TransferOp* original_ = nullptr;
  std::unique_ptr<weightbeam::v1::TransferOp> rebased_;
  std::unique_ptr<uint8_t[]> copy_;
  const uint8_t* base_ = nullptr;
};

}  // namespace wb::executor
