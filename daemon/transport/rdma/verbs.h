// RAII wrappers over rdma-core verbs objects: one unique_ptr alias per ibv_* type, factories
// that return absl::StatusOr, and the named RC queue-pair transitions (ToInit, ToRtr, ToRts).
// Nothing here owns threads or policy; rdma_transport.cc decides what to create and when.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wb::transport::rdma {

// A unique_ptr deleter that hands the object to rdma-core's `Destroy` (its return code is
// dropped: nothing can be done about a failed teardown).
template <auto Destroy>
struct VerbsDeleter {
  template <typename T>
  void operator()(T* object) const {
    Destroy(object);
  }
};

using DeviceListPtr = std::unique_ptr<ibv_device*, VerbsDeleter<ibv_free_device_list>>;
using ContextPtr = std::unique_ptr<ibv_context, VerbsDeleter<ibv_close_device>>;
using PdPtr = std::unique_ptr<ibv_pd, VerbsDeleter<ibv_dealloc_pd>>;
using CompChannelPtr = std::unique_ptr<ibv_comp_channel, VerbsDeleter<ibv_destroy_comp_channel>>;
using CqPtr = std::unique_ptr<ibv_cq, VerbsDeleter<ibv_destroy_cq>>;
using QpPtr = std::unique_ptr<ibv_qp, VerbsDeleter<ibv_destroy_qp>>;
using MrPtr = std::unique_ptr<ibv_mr, VerbsDeleter<ibv_dereg_mr>>;

// Names of the RDMA devices present ("mlx5_0", "rxe0"); empty when there are none.
std::vector<std::string> ListDevices();

// Opens a device by name. NotFound names the devices that do exist.
absl::StatusOr<ContextPtr> OpenDevice(const std::string& name);
absl::StatusOr<PdPtr> CreatePd(ibv_context* ctx);
// The channel's fd is made non-blocking so the poller can wait on it with poll(2).
absl::StatusOr<CompChannelPtr> CreateCompChannel(ibv_context* ctx);
absl::StatusOr<CqPtr> CreateCq(ibv_context* ctx, int entries, ibv_comp_channel* channel);
// An RC queue pair in RESET state; both queues complete into `cq`.
absl::StatusOr<QpPtr> CreateRcQp(ibv_pd* pd, ibv_cq* cq, uint32_t send_depth, uint32_t recv_depth);
absl::StatusOr<MrPtr> RegisterHostMr(ibv_pd* pd, void* addr, uint64_t length, int access);

// What the other side of a queue pair told us (from its RdmaQpRecord).
struct RemoteQp {
  ibv_gid gid{};
  uint32_t lid = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;
};

// RESET -> INIT with the given remote access flags on port `port`.
absl::Status ToInit(ibv_qp* qp, uint8_t port, int access);
// INIT -> RTR towards `remote` (RoCE: a global route through our GID `sgid_index`).
absl::Status ToRtr(ibv_qp* qp, uint8_t port, int sgid_index, ibv_mtu mtu, const RemoteQp& remote);
// RTR -> RTS. `timeout` is the ack timeout exponent (4.096 us * 2^timeout) and `retry_cnt`
// how often to resend before failing the work request: together they bound how long a write
// to a vanished peer can take before it completes in error.
absl::Status ToRts(ibv_qp* qp, uint32_t psn, uint8_t timeout, uint8_t retry_cnt);

// "IBV_WR_RDMA_WRITE" style names for error messages.
const char* OpcodeName(ibv_wr_opcode opcode);

// The largest MTU enum not above `bytes` (256..4096); IBV_MTU_1024 for other values.
ibv_mtu MtuFromBytes(int bytes);
int MtuToBytes(ibv_mtu mtu);

}  // namespace wb::transport::rdma
