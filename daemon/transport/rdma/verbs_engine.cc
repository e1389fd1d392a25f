#include "daemon/transport/rdma/verbs_engine.h"

#include <arpa/inet.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <random>

#include "absl/strings/str_cat.h"
#include "daemon/transport/rdma/chunk_plan.h"

namespace wb::transport::rdma {
namespace {

constexpr int kPollBatch = 32;
constexpr int kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;  // QP level; MRs decide per region

uint32_t RandomPsn() {
  static thread_local std::mt19937 rng(std::random_device{}());
  return rng() & 0xffffff;
}

}  // namespace

VerbsEngine::VerbsEngine(std::vector<Rail> rails, EngineOptions options)
    : rails_(std::move(rails)), options_(options) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread_ = std::thread([this] { Loop(); });
}

VerbsEngine::~VerbsEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  for (auto& [id, batch] : batches_) {
    if (!batch.finished && batch.done) batch.done(absl::CancelledError("rdma transport shut down"));
  }
  connections_.clear();  // queue pairs before the completion queues in rails_
  close(wake_fd_);
}

void VerbsEngine::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void VerbsEngine::RunSync(std::function<void()> fn) {
  std::promise<void> done;
  if (std::this_thread::get_id() == thread_.get_id()) {
    fn();  // a callback (batch done, arrival) called back into us: we already own the state
    return;
  }
  Post([&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

absl::StatusOr<VerbsEngine::NewConnection> VerbsEngine::CreateConnection(const std::string& peer,
                                                                         bool accepted) {
  absl::StatusOr<NewConnection> result;
  RunSync([&] {
    auto conn = std::make_unique<Connection>();
    conn->id = next_connection_++;
    conn->peer = peer;
    conn->accepted = accepted;
    std::vector<QpEndpoint> ours;
    for (int r = 0; r < static_cast<int>(rails_.size()); ++r) {
      Rail& rail = rails_[r];
      for (int q = 0; q < options_.qps_per_rail; ++q) {
        absl::StatusOr<QpPtr> qp = CreateRcQp(rail.pd.get(), rail.cq.get(),
                                              options_.send_queue_depth, options_.recv_queue_depth);
        if (!qp.ok()) {
          result = qp.status();
          return;
        }
        if (absl::Status s = ToInit(qp->get(), rail.port, kAccess); !s.ok()) {
          result = s;
          return;
        }
        QueuePair pair;
        pair.rail = r;
        pair.psn = RandomPsn();
        const int slots = options_.recv_queue_depth + options_.notice_send_slots;
        pair.notice_mem = std::make_unique<uint8_t[]>(slots * options_.notice_bytes);
        absl::StatusOr<MrPtr> mr =
            RegisterHostMr(rail.pd.get(), pair.notice_mem.get(), slots * options_.notice_bytes,
                           IBV_ACCESS_LOCAL_WRITE);
        if (!mr.ok()) {
          result = absl::Status(mr.status().code(),
                                absl::StrCat("registering landing notice "
                                             "buffers on ",
                                             rail.name, ": ", mr.status().message()));
          return;
        }
        pair.notice_mr = std::move(*mr);
        for (int i = 0; i < options_.recv_queue_depth; ++i) pair.free_recv_slots.push_back(i);
        for (int i = 0; i < options_.notice_send_slots; ++i) {
          pair.free_send_slots.push_back(options_.recv_queue_depth + i);
        }
        pair.qp = std::move(*qp);
        QpEndpoint ep;
        ep.device = rail.name;
        ep.gid = rail.gid;
        ep.gid_index = rail.gid_index;
        ep.lid = rail.lid;
        ep.qpn = pair.qp->qp_num;
        ep.psn = pair.psn;
        ep.mtu = rail.mtu;
        ours.push_back(ep);
        conn->qps.push_back(std::move(pair));
      }
    }
    NewConnection created{conn->id, std::move(ours), conn->broken_flag};
    connections_[conn->id] = std::move(conn);
    result = std::move(created);
  });
  return result;
}

absl::Status VerbsEngine::ConnectQps(uint64_t connection, const std::vector<QpEndpoint>& remote,
                                     uint32_t peer_notice_bytes) {
  absl::Status result;
  RunSync([&] {
    auto it = connections_.find(connection);
    if (it == connections_.end()) {
      result = absl::NotFoundError("rdma connection vanished while connecting");
      return;
    }
    Connection& conn = *it->second;
    if (remote.size() != conn.qps.size()) {
      result = absl::FailedPreconditionError(
          absl::StrCat("peer '", conn.peer, "' offers ", remote.size(), " queue pairs, we have ",
                       conn.qps.size(), " (rdma devices x qps_per_peer must match on both sides)"));
      return;
    }
    for (size_t i = 0; i < remote.size(); ++i) {
      QueuePair& qp = conn.qps[i];
      const Rail& rail = rails_[qp.rail];
      RemoteQp peer_qp{remote[i].gid, remote[i].lid, remote[i].qpn, remote[i].psn};
      ibv_mtu mtu = std::min(rail.mtu, remote[i].mtu);
      absl::Status s = ToRtr(qp.qp.get(), rail.port, rail.gid_index, mtu, peer_qp);
      if (s.ok()) s = ToRts(qp.qp.get(), qp.psn, options_.ack_timeout, options_.retry_cnt);
      if (!s.ok()) {
        result = absl::Status(s.code(), absl::StrCat("connecting to peer '", conn.peer, "' on ",
                                                     rail.name, ": ", s.message()));
        return;
      }
      qp.remote_device = remote[i].device;
      qp.recv_missing = options_.recv_queue_depth;
      PostRecvs(conn, qp);
    }
    conn.notice_bytes = std::min<size_t>(options_.notice_bytes, peer_notice_bytes);
    conn.connected = true;
  });
  return result;
}

void VerbsEngine::RunOrDefer(std::function<void()> fn) {
  // From a callback on the poller thread, state it is iterating over must not change under it:
  // run at the top of the next loop instead.
  if (std::this_thread::get_id() == thread_.get_id()) {
    Post(std::move(fn));
  } else {
    RunSync(std::move(fn));
  }
}

void VerbsEngine::DestroyConnection(uint64_t connection, const std::string& reason) {
  RunOrDefer([this, connection, reason] {
    auto it = connections_.find(connection);
    if (it == connections_.end()) return;
    BreakConnection(*it->second, absl::CancelledError(reason));
    it->second->closing = true;
    ReapConnection(connection);
  });
}

void VerbsEngine::DestroyConnections(const std::string& peer, PeerSide side,
                                     const std::string& reason) {
  RunOrDefer([this, peer, side, reason] {
    std::vector<uint64_t> ids;
    for (auto& [id, conn] : connections_) {
      const bool on_side = side == PeerSide::kBoth ||
                           (side == PeerSide::kIncoming ? conn->accepted : !conn->accepted);
      if ((peer.empty() || conn->peer == peer) && on_side) ids.push_back(id);
    }
    for (uint64_t id : ids) {
      BreakConnection(*connections_[id], absl::CancelledError(reason));
      connections_[id]->closing = true;
      ReapConnection(id);
    }
  });
}

void VerbsEngine::SetArrivalCallback(ArrivalCallback cb) {
  RunOrDefer([this, cb = std::move(cb)]() mutable { arrival_ = std::move(cb); });
}

void VerbsEngine::SetLandingNoticeCallback(LandingNoticeCallback cb) {
  RunOrDefer([this, cb = std::move(cb)]() mutable { landing_ = std::move(cb); });
}

void VerbsEngine::QueueClosing(Connection& conn, Batch& batch) {
  batch.last_sent = true;
  QueuePair& qp = conn.qps[batch.last.wr.qp];
  for (PendingWr& notice : batch.notices) {
    qp.pending.push_back(std::move(notice));
    ++queued_wrs_;
  }
  batch.notices.clear();
  qp.pending.push_back(batch.last);
  ++queued_wrs_;
}

void VerbsEngine::Submit(uint64_t connection, std::vector<WorkRequest> wrs, WorkRequest last,
                         uint64_t bytes, std::vector<LandedRange> landed, BatchDone done) {
  Post([this, connection, wrs = std::move(wrs), last, bytes, landed = std::move(landed),
        done = std::move(done)]() mutable {
    auto it = connections_.find(connection);
    if (it == connections_.end() || !it->second->connected || it->second->closing) {
      done(absl::FailedPreconditionError("rdma connection is closed"));
      return;
    }
    Connection& conn = *it->second;
    if (!conn.broken.ok()) {
      done(conn.broken);
      return;
    }
    if (last.qp < 0 || last.qp >= static_cast<int>(conn.qps.size())) {
      done(absl::InvalidArgumentError(
          absl::StrCat("rdma batch names queue pair ", last.qp, " of ", conn.qps.size())));
      return;
    }
    std::vector<std::string> notices;
    if (conn.notice_bytes > 0) {  // a peer without landing notices gets the immediate only
      absl::StatusOr<std::vector<std::string>> encoded =
          EncodeNotices(next_batch_, landed, conn.notice_bytes);
      if (!encoded.ok()) {
        done(encoded.status());
        return;
      }
      notices = std::move(*encoded);
    }
    Batch& batch = batches_[next_batch_];
    batch.id = next_batch_++;
    batch.connection = connection;
    batch.bytes = bytes;
    batch.done = std::move(done);
    batch.deadline = std::chrono::steady_clock::now() + options_.batch_timeout;
    batch.outstanding = wrs.size();
    batch.last = PendingWr{batch.id, last, true, htonl(EncodeBatchBytes(bytes)), nullptr};
    for (std::string& n : notices) {
      WorkRequest on_qp;
      on_qp.qp = last.qp;
      batch.notices.push_back(
          PendingWr{batch.id, on_qp, false, 0, std::make_shared<const std::string>(std::move(n))});
    }
    for (const WorkRequest& wr : wrs) {
      conn.qps[wr.qp].pending.push_back(PendingWr{batch.id, wr, false, 0, nullptr});
      ++queued_wrs_;
    }
    if (wrs.empty()) QueueClosing(conn, batch);
  });
}

void VerbsEngine::Loop() {
  while (true) {
    if (!RunCommands()) break;
    size_t queued_before = queued_wrs_;
    PostPending();
    int completions = PollCompletions();
    auto now = std::chrono::steady_clock::now();
    if (completions > 0 || queued_wrs_ != queued_before) last_progress_ = now;
    if (now >= next_deadline_check_) {
      CheckDeadlines();
      next_deadline_check_ = now + std::chrono::milliseconds(5);
    }
    if (completions > 0 || queued_wrs_ > 0) continue;  // queued work waits for credits
    // Only posted sends are worth spinning for; posted receives may wait for hours.
    bool sends_in_flight = false;
    for (const auto& [id, batch] : batches_) sends_in_flight |= batch.in_flight > 0;
    if (sends_in_flight && now - last_progress_ < options_.busy_poll) continue;
    WaitForEvents(batches_.empty() ? std::chrono::milliseconds(200) : std::chrono::milliseconds(5));
  }
}

bool VerbsEngine::RunCommands() {
  std::deque<std::function<void()>> commands;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    commands.swap(commands_);
  }
  for (auto& fn : commands) fn();
  if (!commands.empty()) last_progress_ = std::chrono::steady_clock::now();
  return true;
}

void VerbsEngine::PostPending() {
  if (queued_wrs_ == 0) return;
  for (auto& [id, conn_ptr] : connections_) {
    Connection& conn = *conn_ptr;
    for (int qi = 0; qi < static_cast<int>(conn.qps.size()); ++qi) {
      QueuePair& qp = conn.qps[qi];
      Rail& rail = rails_[qp.rail];
      if (qp.recv_missing > 0) PostRecvs(conn, qp);
      int credits =
          std::min(options_.send_queue_depth - qp.send_used, rail.cq_capacity - rail.cq_used);
      if (qp.pending.empty() || credits <= 0) continue;
      std::vector<ibv_send_wr> wrs;
      std::vector<ibv_sge> sges;
      wrs.reserve(std::min<size_t>(credits, qp.pending.size()));
      sges.reserve(wrs.capacity());
      while (!qp.pending.empty() && static_cast<int>(wrs.size()) < credits) {
        // A notice needs a send buffer: without one, it and what follows wait (in order).
        if (qp.pending.front().notice && qp.free_send_slots.empty()) break;
        PendingWr p = std::move(qp.pending.front());
        qp.pending.pop_front();
        --queued_wrs_;
        auto batch = batches_.find(p.batch);
        if (batch == batches_.end() || batch->second.finished) continue;  // failed or timed out
        uint64_t wr_id = next_wr_id_++;
        ibv_send_wr wr{};
        wr.wr_id = wr_id;
        wr.send_flags = IBV_SEND_SIGNALED;
        int slot = -1;
        if (p.notice) {
          slot = qp.free_send_slots.back();
          qp.free_send_slots.pop_back();
          uint8_t* buf = NoticeSlot(qp, slot);
          const size_t n = std::min(p.notice->size(), options_.notice_bytes);
          std::memcpy(buf, p.notice->data(), n);
          sges.push_back(ibv_sge{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(n),
                                 qp.notice_mr->lkey});
          wr.sg_list = &sges.back();
          wr.num_sge = 1;
          wr.opcode = IBV_WR_SEND;
        } else {
          sges.push_back(ibv_sge{p.wr.local_addr, p.wr.length, p.wr.lkey});
          wr.sg_list = p.wr.length > 0 ? &sges.back() : nullptr;
          wr.num_sge = p.wr.length > 0 ? 1 : 0;
          wr.opcode = p.with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
          wr.imm_data = p.imm;
          wr.wr.rdma.remote_addr = p.wr.remote_addr;
          wr.wr.rdma.rkey = p.wr.rkey;
        }
        wrs.push_back(wr);
        inflight_[wr_id] = InflightWr{p.batch, conn.id, qi, wr.opcode, false, slot};
        ++batch->second.in_flight;
      }
      if (wrs.empty()) continue;
      for (size_t i = 0; i + 1 < wrs.size(); ++i) wrs[i].next = &wrs[i + 1];
      ibv_send_wr* bad = nullptr;
      int rc = ibv_post_send(qp.qp.get(), wrs.data(), &bad);
      int posted = static_cast<int>(wrs.size());
      if (rc != 0) {
        posted = bad ? static_cast<int>(bad - wrs.data()) : 0;
        for (size_t i = posted; i < wrs.size(); ++i) {
          auto info = inflight_.find(wrs[i].wr_id);
          --batches_[info->second.batch].in_flight;
          if (info->second.slot >= 0) qp.free_send_slots.push_back(info->second.slot);
          inflight_.erase(info);
        }
      }
      qp.send_used += posted;
      rail.cq_used += posted;
      if (rc != 0) {
        BreakConnection(
            conn, absl::InternalError(absl::StrCat("ibv_post_send to peer '", conn.peer, "' on ",
                                                   rail.name, " failed: ", std::strerror(rc))));
      }
    }
  }
}

void VerbsEngine::PostRecvs(Connection& conn, QueuePair& qp) {
  Rail& rail = rails_[qp.rail];
  while (qp.recv_missing > 0 && rail.cq_used < rail.cq_capacity && conn.broken.ok() &&
         !qp.free_recv_slots.empty()) {
    uint64_t wr_id = next_wr_id_++;
    const int slot = qp.free_recv_slots.back();
    ibv_sge sge{reinterpret_cast<uint64_t>(NoticeSlot(qp, slot)),
                static_cast<uint32_t>(options_.notice_bytes), qp.notice_mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(qp.qp.get(), &wr, &bad) != 0) break;
    qp.free_recv_slots.pop_back();
    inflight_[wr_id] =
        InflightWr{0, conn.id, static_cast<int>(&qp - conn.qps.data()), IBV_WR_SEND, true, slot};
    --qp.recv_missing;
    ++qp.recv_posted;
    ++rail.cq_used;
  }
}

int VerbsEngine::PollCompletions() {
  int total = 0;
  ibv_wc wcs[kPollBatch];
  for (Rail& rail : rails_) {
    int n;
    do {
      n = ibv_poll_cq(rail.cq.get(), kPollBatch, wcs);
      for (int i = 0; i < n; ++i) {
        --rail.cq_used;
        HandleCompletion(wcs[i]);
      }
      total += std::max(n, 0);
    } while (n == kPollBatch);
  }
  return total;
}

void VerbsEngine::HandleCompletion(const ibv_wc& wc) {
  auto it = inflight_.find(wc.wr_id);
  if (it == inflight_.end()) return;
  InflightWr info = it->second;
  inflight_.erase(it);
  auto conn_it = connections_.find(info.connection);
  Connection* conn = conn_it == connections_.end() ? nullptr : conn_it->second.get();
  QueuePair* qp = conn ? &conn->qps[info.qp] : nullptr;

  if (info.recv) {
    if (qp == nullptr) return;
    --qp->recv_posted;
    if (wc.status == IBV_WC_SUCCESS) {
      auto bad_notice = [&](const absl::Status& why) {
        if (bad_notices_++ % 1000 < 5) {
          spdlog::warn("rdma: landing notice from peer '{}' on {} ignored ({} so far): {}",
                       conn->peer, rails_[qp->rail].name, bad_notices_, std::string(why.message()));
        }
      };
      if (wc.opcode == IBV_WC_RECV) {
        // A landing notice: held until the immediate closing its batch is polled.
        const size_t size = std::min<size_t>(wc.byte_len, options_.notice_bytes);
        if (info.slot >= 0) {
          if (absl::Status s = qp->notices.Add(NoticeSlot(*qp, info.slot), size); !s.ok()) {
            bad_notice(s);
          }
        }
      } else if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        if (arrival_) arrival_(conn->peer, DecodeBatchBytes(ntohl(wc.imm_data)));
        // Every write of the batch is placed: the sender posted the immediate only after the
        // others were acknowledged, and this queue pair delivers its notices before it.
        absl::StatusOr<std::vector<LandedRange>> landed = qp->notices.Close();
        if (!landed.ok()) {
          // No notice at all: a sender without landing notices (nothing to report, no lie).
          if (!absl::IsNotFound(landed.status())) bad_notice(landed.status());
        } else if (landing_ && !landed->empty()) {
          landing_(conn->peer, *landed);
        }
      }
    }
    if (info.slot >= 0) qp->free_recv_slots.push_back(info.slot);
    if (wc.status == IBV_WC_SUCCESS) {
      ++qp->recv_missing;
      PostRecvs(*conn, *qp);
    }
    if (conn->closing) ReapConnection(conn->id);
    return;
  }

  if (qp != nullptr) --qp->send_used;
  if (qp != nullptr && info.slot >= 0) qp->free_send_slots.push_back(info.slot);
  auto batch_it = batches_.find(info.batch);
  if (batch_it == batches_.end()) return;
  Batch& batch = batch_it->second;
  --batch.in_flight;
  if (wc.status != IBV_WC_SUCCESS) {
    absl::Status error;
    if (wc.status == IBV_WC_WR_FLUSH_ERR && conn != nullptr && !conn->broken.ok()) {
      error = conn->broken;
    } else {
      std::string peer = conn ? conn->peer : "?";
      std::string device = qp ? rails_[qp->rail].name : "?";
      error = absl::UnavailableError(absl::StrCat(
          "rdma write to peer '", peer, "' on ", device, " failed: ", OpcodeName(info.opcode), ": ",
          ibv_wc_status_str(wc.status), " (status ", static_cast<int>(wc.status), ", vendor error ",
          wc.vendor_err, ")",
          wc.status == IBV_WC_REM_ACCESS_ERR
              ? ": the receiver refused the write (wrong key, out of bounds or not registered)"
              : ""));
    }
    if (conn != nullptr) BreakConnection(*conn, error);
    FinishBatch(batch, error);
  } else if (info.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
    FinishBatch(batch, absl::OkStatus());
  } else if (info.opcode == IBV_WR_SEND) {
    // A landing notice went out; the immediate follows it on the same queue pair.
  } else if (--batch.outstanding == 0 && !batch.last_sent && !batch.finished && qp != nullptr) {
    // Every other write has been acknowledged: the notices and the immediate now tell the
    // receiver that the whole batch is in place, and where.
    QueueClosing(*conn, batch);
  }
  ReapBatch(info.batch);
  if (conn != nullptr && conn->closing) ReapConnection(conn->id);
}

void VerbsEngine::FinishBatch(Batch& batch, absl::Status status) {
  if (batch.finished) return;
  batch.finished = true;
  BatchDone done = std::move(batch.done);
  if (done) done(std::move(status));
}

void VerbsEngine::ReapBatch(uint64_t batch_id) {
  auto it = batches_.find(batch_id);
  if (it != batches_.end() && it->second.finished && it->second.in_flight == 0) {
    batches_.erase(it);
  }
}

void VerbsEngine::BreakConnection(Connection& conn, absl::Status status) {
  if (conn.broken.ok()) conn.broken = status;
  conn.broken_flag->store(true);
  for (QueuePair& qp : conn.qps) {
    for (const PendingWr& p : qp.pending) {
      auto it = batches_.find(p.batch);
      if (it != batches_.end()) FinishBatch(it->second, conn.broken);
      --queued_wrs_;
    }
    qp.pending.clear();
    qp.recv_missing = 0;
    // Flush whatever is still posted so its completions come back and free the credits.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(qp.qp.get(), &attr, IBV_QP_STATE);
  }
  std::vector<uint64_t> reap;
  for (auto& [id, batch] : batches_) {
    if (batch.connection == conn.id && !batch.finished) FinishBatch(batch, conn.broken);
    if (batch.connection == conn.id) reap.push_back(id);
  }
  for (uint64_t id : reap) ReapBatch(id);
}

void VerbsEngine::ReapConnection(uint64_t connection_id) {
  auto it = connections_.find(connection_id);
  if (it == connections_.end()) return;
  Connection& conn = *it->second;
  for (const QueuePair& qp : conn.qps) {
    if (qp.send_used > 0 || qp.recv_posted > 0) return;  // flush completions still to come
  }
  connections_.erase(it);
}

void VerbsEngine::CheckDeadlines() {
  auto now = std::chrono::steady_clock::now();
  for (auto& [id, batch] : batches_) {
    if (batch.finished || now < batch.deadline) continue;
    auto conn = connections_.find(batch.connection);
    std::string peer = conn == connections_.end() ? "?" : conn->second->peer;
    FinishBatch(batch, absl::DeadlineExceededError(absl::StrCat(
                           "rdma write batch to peer '", peer, "' did not complete within ",
                           options_.batch_timeout.count(), " ms (", batch.in_flight,
                           " work requests still posted)")));
  }
}

void VerbsEngine::WaitForEvents(std::chrono::milliseconds max_wait) {
  // Arm every CQ, then look once more so a completion that raced the arming is not missed.
  for (Rail& rail : rails_) ibv_req_notify_cq(rail.cq.get(), 0);
  if (PollCompletions() > 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!commands_.empty() || stop_) return;
  }
  std::vector<pollfd> fds;
  fds.push_back(pollfd{wake_fd_, POLLIN, 0});
  for (Rail& rail : rails_) fds.push_back(pollfd{rail.channel->fd, POLLIN, 0});
  poll(fds.data(), fds.size(), static_cast<int>(max_wait.count()));
  uint64_t counter;
  (void)!read(wake_fd_, &counter, sizeof(counter));
  for (Rail& rail : rails_) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(rail.channel.get(), &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  }
}

}  // namespace wb::transport::rdma
