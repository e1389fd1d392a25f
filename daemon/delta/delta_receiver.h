// Delta mode, receiving side: one receive region (host memory registered with every transport)
// with a slot per incoming operation, into which senders write packed deltas one-sidedly; at
// commit the slots of that attempt are scattered into the destination tensors (CPU for host
// memory, a CUDA kernel for GPU memory), and with verification on, the destinations are hashed
// and compared with the senders' hashes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/delta/gpu_apply.h"
#include "daemon/delta/op_layout.h"
#include "daemon/registry/region_registry.h"
#include "daemon/transport/transport.h"
#include "weightbeam/v1/agent.pb.h"
#include "weightbeam/v1/types.pb.h"

namespace wb::delta {

// Agent-wide ids of receive regions start here (tensor regions count up from 1).
constexpr uint64_t kReceiveRegionBase = uint64_t{1} << 62;

struct ApplyStats {
  uint64_t slots_applied = 0;
  uint64_t payload_bytes = 0;
  uint64_t dense_bytes = 0;  // destination bytes the applied ops cover
  double seconds = 0;
};

struct DeltaReceiverOptions {
  // Test hook: the commit of this version fails after half of its slots are applied (a
  // destination left half-written, which the next anchor must heal). 0: off.
  uint64_t fail_commit_version = 0;
};

class DeltaReceiver {
 public:
  DeltaReceiver(std::string agent, std::vector<transport::Transport*> transports,
                const registry::RegionRegistry* registry, DeltaReceiverOptions options = {});
  ~DeltaReceiver();

  // Replaces the receive region with one sized for `plan.incoming()` and fills `resp` with its
  // descriptor and slot table. Destinations in GPU memory need a CUDA build and device (the
  // error names the tensor and the reason if not).
  absl::Status Load(const weightbeam::v1::AgentPlan& plan, weightbeam::v1::LoadPlanResponse* resp);

  // Applies every slot written for (version, nonce), then checks `expected` hashes (those for
  // this agent). Errors name the op and destination tensor.
  absl::Status Apply(uint64_t version, uint64_t nonce,
                     const std::vector<weightbeam::v1::OpHash>& expected, ApplyStats* stats);

 private:
  struct Incoming {
    std::string src_agent;
    weightbeam::v1::TransferOp op;
    OpLayout layout;
    uint64_t slot_offset = 0;
    uint64_t capacity = 0;
  };
  absl::Status ApplySlot(const Incoming& in, uint64_t version, uint64_t nonce, bool* applied,
                         uint64_t* payload) const;
  absl::StatusOr<uint64_t> DestinationHash(const Incoming& in) const;
  void Release();
  // Host or device memory of a registered destination region.
  static DestinationMemory MemoryOf(const registry::RegisteredTensor* t);

  const std::string agent_;
  const std::vector<transport::Transport*> transports_;
  const registry::RegionRegistry* registry_;
  const uint64_t fail_commit_version_;  // test hook: DeltaReceiverOptions
  mutable GpuApplier gpu_;              // staging buffers and streams for GPU destinations

  absl::Mutex mu_;
  uint8_t* memory_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t length_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> transport_regions_ ABSL_GUARDED_BY(mu_);
  std::vector<Incoming> incoming_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, uint64_t>, size_t> by_op_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wb::delta
