// Delta mode, sending side: per plan operation a shadow of the bytes its destination holds (host
// memory), change detection of each step's transformed output against it, and the decision to
// ship the op as a packed delta into the receiver's slot or dense as usual. Ops read in place
// from CUDA memory are compared on their device instead (GpuDeltaEncoder, shadow on the device
// or in mapped host memory): the same packed records, only those cross to the host.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/delta/delta_codec.h"
#include "daemon/delta/gpu_encoder.h"
#include "daemon/delta/op_layout.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::delta {

// What the controller asked of this step.
struct StepDelta {
  bool enabled = false;  // false: dense as without delta mode (no staging for copies)
  bool anchor = true;    // send every op dense and refresh the shadows
  bool verify = false;   // report the expected destination hash of every op
  uint64_t version = 0;
  uint64_t nonce = 0;
};

// How one op goes out this step.
struct OpOutcome {
  bool packed = false;       // true: `flat` now holds slot header + packed delta
  uint64_t write_bytes = 0;  // packed: header + delta bytes
  uint64_t slot_region = 0;  // packed: the receive region (agent-wide id) and offset
  uint64_t slot_offset = 0;
  uint64_t hash = 0;           // verify: hash of the bytes the destination must hold
  uint64_t changed_elems = 0;  // packed: changed elements; dense: a lower bound
};

class DeltaSender {
 public:
  // `plan`: the sending agent's plan (ops and delta_slots). Ops of 64 MiB or more are scanned
  // on `big_op_threads` threads (an op that large mostly runs alone in the executor).
  // `gpu_shadow`: where the shadows of ops compared on a GPU live (ProcessOnDevice).
  explicit DeltaSender(const weightbeam::v1::AgentPlan& plan, int big_op_threads = 1,
                       ShadowPlacement gpu_shadow = ShadowPlacement::kDevice);

  // The op's layout (flat bytes the executor must stage), or null for an unknown op.
  const OpLayout* Layout(uint64_t op_id) const;

  // `flat` holds the op's transformed bytes (Layout(op_id)->flat_bytes). Compares them with the
  // shadow and updates it. Safe to call for different ops from different threads at once.
  absl::StatusOr<OpOutcome> Process(const weightbeam::v1::TransferOp& op, uint8_t* flat,
                                    const StepDelta& step);
  // The same for an op whose bytes are read in place (a contiguous copy, zero-copy): `flat` is
  // only read, and a packed outcome's slot bytes (header + delta) go to `slot_bytes`.
  absl::StatusOr<OpOutcome> ProcessInPlace(const weightbeam::v1::TransferOp& op,
                                           const uint8_t* flat, const StepDelta& step,
                                           std::vector<uint8_t>* slot_bytes);
  // The same for a contiguous copy whose bytes are CUDA memory on `device`: compared on that
  // device by the GPU encoder against a shadow kept there (delta_sender_gpu.cc). Errors say
  // "delta encode on cuda:N: ..." (FAILED_PRECONDITION without CUDA or without a device).
  absl::StatusOr<OpOutcome> ProcessOnDevice(const weightbeam::v1::TransferOp& op,
                                            const uint8_t* device_flat, int device,
                                            const StepDelta& step,
                                            std::vector<uint8_t>* slot_bytes);

  // The destination may no longer hold what the shadows say (aborted or failed step): every op
  // goes dense on the next step.
  void Invalidate() { invalid_ = true; }
  // True once after Invalidate (the executor turns the next step into an anchor).
  bool TakeInvalidated() { return invalid_.exchange(false); }

  uint64_t shadow_bytes() const;  // host shadows
  ShadowPlacement gpu_shadow_placement() const { return gpu_shadow_; }

 private:
  struct OpState;
  // Compares and updates the shadow; on a packed outcome `packed` holds the delta.
  absl::StatusOr<OpOutcome> Encode(const weightbeam::v1::TransferOp& op, OpState& st,
                                   const uint8_t* flat, const StepDelta& step,
                                   std::vector<uint8_t>* packed);
  // A computed encoding as this op's outcome: packed into its slot when it has one and the
  // packed form is no larger than dense, else dense.
  static void Decide(const OpState& st, DeltaEncoding enc, OpOutcome* out,
                     std::vector<uint8_t>* packed);
  // Header + packed records as the slot write.
  static void WriteSlot(const weightbeam::v1::TransferOp& op, const StepDelta& step,
                        const std::vector<uint8_t>& packed, std::vector<uint8_t>* slot_bytes);
  // One GPU encoder per device, used by one preparer at a time.
  struct DeviceEncoder {
    explicit DeviceEncoder(int device) : encoder(device) {}
    absl::Mutex mu;
    GpuDeltaEncoder encoder;
  };
  absl::StatusOr<DeviceEncoder*> EncoderFor(int device);

  struct OpState {
    OpLayout layout;
    bool has_slot = false;
    weightbeam::v1::DeltaSlot slot;
    std::vector<uint8_t> shadow;  // empty until the first anchor
    GpuShadow gpu_shadow;         // ops compared on a GPU: instead of `shadow`
    int gpu_device = -1;          // the device gpu_shadow belongs to
    bool valid = false;
  };
  std::map<uint64_t, std::unique_ptr<OpState>> ops_;  // by op id; fixed after construction
  std::atomic<bool> invalid_{false};
  int big_op_threads_ = 1;
  ShadowPlacement gpu_shadow_ = ShadowPlacement::kDevice;
  absl::Mutex encoders_mu_;
  std::map<int, std::unique_ptr<DeviceEncoder>> encoders_ ABSL_GUARDED_BY(encoders_mu_);
};

}  // namespace wb::delta
