// DeltaSender for ops read in place from CUDA memory: the GPU encoder compares them on their
// device against a shadow it keeps there (or in mapped host memory), so only the packed records
// cross to the host. The outcome rules (anchor, slot, packed only when smaller) are the host
// path's (delta_sender.cc).
#include "absl/strings/str_cat.h"
#include "daemon/delta/delta_sender.h"
#include "daemon/gpu/device_memory.h"
#include "daemon/gpu/staging.h"

namespace wb::delta {

namespace v1 = weightbeam::v1;

absl::StatusOr<DeltaSender::DeviceEncoder*> DeltaSender::EncoderFor(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta encode: CUDA memory without a device (", device, ")"));
  }
  if (auto s = GpuEncodeAvailable(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("delta encode on cuda:", device, ": ", s.message()));
  }
  absl::MutexLock lock(&encoders_mu_);
  auto& e = encoders_[device];
  if (!e) e = std::make_unique<DeviceEncoder>(device);
  return e.get();
}

absl::StatusOr<OpOutcome> DeltaSender::ProcessOnDevice(const v1::TransferOp& op,
                                                       const uint8_t* device_flat, int device,
                                                       const StepDelta& step,
                                                       std::vector<uint8_t>* slot_bytes) {
  auto it = ops_.find(op.op_id());
  if (it == ops_.end()) {
    return absl::InternalError(absl::StrCat("op ", op.op_id(), " is not in the delta state"));
  }
  OpState& st = *it->second;
  const OpLayout& l = st.layout;
  // Any failure leaves the shadow unknown: the next step seeds it again.
  auto fail = [&st](const absl::Status& s) {
    st.valid = false;
    return s;
  };
  auto encoder = EncoderFor(device);
  if (!encoder.ok()) return fail(encoder.status());
  // The kernels read the source in place: a range that is not device memory of `device` (host
  // memory labelled cuda) is refused before a kernel faults on it. Checked once, when the op's
  // shadow is made: a shadow that fits means its source passed (not per op on every step).
  const bool fits = st.gpu_device == device && st.gpu_shadow.size() == l.flat_bytes;
  if (!fits) {
    if (auto s = gpu::CheckDeviceRange(device_flat, l.flat_bytes, device); !s.ok()) {
      return fail(absl::Status(
          s.code(), absl::StrCat("delta encode on cuda:", device, ": source: ", s.message())));
    }
  }
  absl::MutexLock lock(&(*encoder)->mu);
  GpuDeltaEncoder& gpu = (*encoder)->encoder;
  OpOutcome out;
  if (step.verify) {
    // Verification is a test mode: the hash is computed on the host, from a copy.
    std::vector<uint8_t> host(l.flat_bytes);
    if (auto s = gpu::CopyDeviceToHost(host.data(), device_flat, l.flat_bytes, device); !s.ok()) {
      return fail(absl::Status(
          s.code(), absl::StrCat("delta encode on cuda:", device, ": verify copy: ", s.message())));
    }
    out.hash = HashFlat(l, host.data());
  }
  if (step.anchor || !st.valid || !fits) {
    if (!fits) {
      st.gpu_shadow = GpuShadow();  // the old one goes before the new one is allocated
      auto shadow = GpuShadow::Allocate(gpu.device_encoder(), l.flat_bytes, gpu_shadow_);
      if (!shadow.ok()) return fail(shadow.status());
      st.gpu_shadow = std::move(*shadow);
      st.gpu_device = device;
    }
    if (auto s = gpu.Seed(st.gpu_shadow, device_flat, l.flat_bytes); !s.ok()) return fail(s);
    st.valid = true;
    out.changed_elems = l.flat_bytes / l.elem_size;  // unknown: counted as all
    return out;
  }
  auto enc = gpu.Encode(st.gpu_shadow, device_flat, l.flat_bytes, l.elem_size);
  if (!enc.ok()) {
    // The shadow may be half refreshed (a source that changed between the kernel passes, a
    // CUDA error): the next step seeds it again instead of comparing against it.
    st.valid = false;
    return fail(absl::Status(enc.status().code(),
                             absl::StrCat("change detection: ", enc.status().message())));
  }
  std::vector<uint8_t> packed;
  Decide(st, std::move(*enc), &out, &packed);
  if (out.packed) WriteSlot(op, step, packed, slot_bytes);
  return out;
}

}  // namespace wb::delta
