#include "daemon/transport/rdma/verbs.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wb::transport::rdma {
namespace {

absl::Status ErrnoStatus(const std::string& what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

std::string DeviceName(ibv_context* ctx) { return ibv_get_device_name(ctx->device); }

}  // namespace

std::vector<std::string> ListDevices() {
  int count = 0;
  DeviceListPtr list(ibv_get_device_list(&count));
  std::vector<std::string> names;
  for (int i = 0; list && i < count; ++i) names.push_back(ibv_get_device_name(list.get()[i]));
  return names;
}

absl::StatusOr<ContextPtr> OpenDevice(const std::string& name) {
  int count = 0;
  DeviceListPtr list(ibv_get_device_list(&count));
  std::vector<std::string> present;
  for (int i = 0; list && i < count; ++i) {
    ibv_device* dev = list.get()[i];
    if (name != ibv_get_device_name(dev)) {
      present.push_back(ibv_get_device_name(dev));
      continue;
    }
    ContextPtr ctx(ibv_open_device(dev));
    if (!ctx) return ErrnoStatus("ibv_open_device(" + name + ")", errno);
    return ctx;
  }
  return absl::NotFoundError(absl::StrCat(
      "RDMA device '", name,
      "' not found (present: ", present.empty() ? "none" : absl::StrJoin(present, ", "), ")"));
}

absl::StatusOr<PdPtr> CreatePd(ibv_context* ctx) {
  PdPtr pd(ibv_alloc_pd(ctx));
  if (!pd) return ErrnoStatus("ibv_alloc_pd on " + DeviceName(ctx), errno);
  return pd;
}

absl::StatusOr<CompChannelPtr> CreateCompChannel(ibv_context* ctx) {
  CompChannelPtr ch(ibv_create_comp_channel(ctx));
  if (!ch) return ErrnoStatus("ibv_create_comp_channel on " + DeviceName(ctx), errno);
  int flags = fcntl(ch->fd, F_GETFL);
  if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoStatus("making the completion channel of " + DeviceName(ctx) + " non-blocking",
                       errno);
  }
  return ch;
}

absl::StatusOr<CqPtr> CreateCq(ibv_context* ctx, int entries, ibv_comp_channel* channel) {
  CqPtr cq(ibv_create_cq(ctx, entries, nullptr, channel, 0));
  if (!cq) {
    return ErrnoStatus(absl::StrCat("ibv_create_cq(", entries, ") on ", DeviceName(ctx)), errno);
  }
  return cq;
}

absl::StatusOr<QpPtr> CreateRcQp(ibv_pd* pd, ibv_cq* cq, uint32_t send_depth, uint32_t recv_depth) {
  ibv_qp_init_attr attr{};
  attr.send_cq = cq;
  attr.recv_cq = cq;
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = send_depth;
  attr.cap.max_recv_wr = recv_depth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  QpPtr qp(ibv_create_qp(pd, &attr));
  if (!qp) {
    return ErrnoStatus(absl::StrCat("ibv_create_qp(RC, send ", send_depth, ", recv ", recv_depth,
                                    ") on ", DeviceName(pd->context)),
                       errno);
  }
  return qp;
}

absl::StatusOr<MrPtr> RegisterHostMr(ibv_pd* pd, void* addr, uint64_t length, int access) {
  MrPtr mr(ibv_reg_mr(pd, addr, length, access));
  if (!mr) {
    return ErrnoStatus(absl::StrCat("ibv_reg_mr(", length, " bytes) on ", DeviceName(pd->context)),
                       errno);
  }
  return mr;
}

absl::Status ToInit(ibv_qp* qp, uint8_t port, int access) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = port;
  attr.qp_access_flags = access;
  int rc = ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return ErrnoStatus(absl::StrCat("QP ", qp->qp_num, " RESET->INIT"), rc);
  return absl::OkStatus();
}

absl::Status ToRtr(ibv_qp* qp, uint8_t port, int sgid_index, ibv_mtu mtu, const RemoteQp& remote) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = mtu;
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.port_num = port;
  attr.ah_attr.dlid = remote.lid;
  if (sgid_index >= 0) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = remote.gid;
    attr.ah_attr.grh.sgid_index = sgid_index;
    attr.ah_attr.grh.hop_limit = 64;
  }
  int rc = ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) {
    return ErrnoStatus(absl::StrCat("QP ", qp->qp_num, " INIT->RTR (remote QPN ", remote.qpn, ")"),
                       rc);
  }
  return absl::OkStatus();
}

absl::Status ToRts(ibv_qp* qp, uint32_t psn, uint8_t timeout, uint8_t retry_cnt) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = psn;
  attr.timeout = timeout;
  attr.retry_cnt = retry_cnt;
  attr.rnr_retry = 7;
  attr.max_rd_atomic = 1;
  int rc = ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                             IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return ErrnoStatus(absl::StrCat("QP ", qp->qp_num, " RTR->RTS"), rc);
  return absl::OkStatus();
}

const char* OpcodeName(ibv_wr_opcode opcode) {
  switch (opcode) {
    case IBV_WR_RDMA_WRITE:
      return "IBV_WR_RDMA_WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return "IBV_WR_RDMA_WRITE_WITH_IMM";
    case IBV_WR_SEND:
      return "IBV_WR_SEND";
    case IBV_WR_RDMA_READ:
      return "IBV_WR_RDMA_READ";
    default:
      return "IBV_WR_OTHER";
  }
}

ibv_mtu MtuFromBytes(int bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  if (bytes >= 256) return IBV_MTU_256;
  return IBV_MTU_1024;
}

int MtuToBytes(ibv_mtu mtu) { return 128 << static_cast<int>(mtu); }

}  // namespace wb::transport::rdma
