#include "daemon/transport/tcp/tcp_peer.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/transport/tcp/frame.h"
#include "daemon/transport/tcp/gpu_io.h"
#include "weightbeam/v1/transport.pb.h"

namespace wb::transport::tcp {
namespace {

// Below this a batch uses fewer connections. A batch of one share goes whole to the connection
// with the fewest bytes waiting: a step posts its batches (the executor's groups of ops, up to
// 4 MiB) faster than they drain, and splitting each of them cost a FLUSH, an ACK and their
// sends, receives and wake-ups per share for no gain in parallelism.
constexpr uint64_t kMinShareBytes = 4 << 20;
constexpr uint64_t kSendSliceBytes = 4 << 20;  // payload bytes per send call
// Jobs up to this size are sent by the posting thread when the connection is idle: small
// enough to fit the socket's send buffer, so the caller does not wait on the network.
constexpr uint64_t kInlineSendBytes = 64 << 10;
// Rows up to this size that land back to back in one remote region go out as one WRITE frame
// gathered from their places in the source (sendmsg's iovecs): a strided source (a column
// shard of the trainer's rows, e.g. o_proj / down_proj under TP) costs one frame and a few
// sends per op instead of a header, a send and two receives per row of 2-3 KiB.
constexpr uint64_t kGatherRowBytes = 64 << 10;
constexpr size_t kGatherIovecs = 512;  // per sendmsg (IOV_MAX is 1024)

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status WithContext(const absl::Status& status, const std::string& context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace

struct TcpPeer::Batch {
  uint64_t id = 0;
  BatchDone done;
  std::atomic<int> remaining{0};
  std::atomic<bool> finished{false};
};

TcpPeer::TcpPeer(std::string our_name, std::string peer_name, std::string endpoint,
                 uint64_t max_frame_bytes, std::shared_ptr<RegionTable> regions,
                 const TcpOptions& options)
    : our_name_(std::move(our_name)),
      peer_name_(std::move(peer_name)),
      endpoint_(std::move(endpoint)),
      max_frame_bytes_(max_frame_bytes),
      regions_(std::move(regions)),
      options_(options) {}

absl::StatusOr<std::shared_ptr<TcpPeer>> TcpPeer::Connect(
    std::string our_name, std::string peer_name, const std::string& endpoint,
    const std::string& token, uint64_t max_frame_bytes, std::shared_ptr<RegionTable> regions,
    const TcpOptions& options) {
  std::shared_ptr<TcpPeer> peer(new TcpPeer(std::move(our_name), std::move(peer_name), endpoint,
                                            std::min(max_frame_bytes, options.max_frame_bytes),
                                            std::move(regions), options));
  if (auto st = peer->OpenConnections(token); !st.ok()) return st;
  peer->Start();
  return peer;
}

std::string TcpPeer::Where() const {
  return absl::StrCat("tcp peer '", peer_name_, "' (", endpoint_, ")");
}

absl::Status TcpPeer::OpenConnections(const std::string& token) {
  auto where = net::ParseHostPort(endpoint_);
  if (!where.ok()) return WithContext(where.status(), Where());
  weightbeam::v1::TcpHello hello;
  hello.set_from_agent(our_name_);
  hello.set_token(token);
  const std::string payload = hello.SerializeAsString();
  for (int i = 0; i < options_.connections_per_peer; ++i) {
    const std::string context = absl::StrCat(Where(), ": connection ", i);
    auto fd = net::ConnectTcp(*where, options_.connect_timeout);
    if (!fd.ok()) return WithContext(fd.status(), context);
    // Bounded wait for the HELLO's ACK; afterwards the ack reader blocks without limit.
    // No send timeout: the monitor thread detects stalls and shuts the sockets down.
    if (auto st = net::TuneSocket(fd->get(), options_.socket_buffer_bytes,
                                  std::chrono::milliseconds(0), options_.connect_timeout);
        !st.ok()) {
      return WithContext(st, context);
    }
    FrameHeader header;
    header.type = FrameType::kHello;
    header.length = payload.size();
    uint8_t raw[kFrameHeaderBytes];
    EncodeFrameHeader(header, raw);
    iovec iov[2] = {{raw, sizeof(raw)}, {const_cast<char*>(payload.data()), payload.size()}};
    if (auto st = net::SendAll(fd->get(), iov, 2); !st.ok()) return WithContext(st, context);
    size_t got = 0;
    if (net::RecvExact(fd->get(), raw, sizeof(raw), &got, nullptr) != net::RecvOutcome::kOk) {
      return absl::PermissionDeniedError(absl::StrCat(
          context,
          ": handshake refused (connection closed before ACK; token unknown to the peer?)"));
    }
    auto ack = ParseFrameHeader(raw, sizeof(raw));
    if (!ack.ok() || ack->type != FrameType::kAck || ack->batch_id != 0) {
      return absl::PermissionDeniedError(absl::StrCat(context, ": bad handshake reply"));
    }
    if (auto st = net::TuneSocket(fd->get(), options_.socket_buffer_bytes,
                                  std::chrono::milliseconds(0), std::chrono::milliseconds(0));
        !st.ok()) {
      return WithContext(st, context);
    }
    auto conn = std::make_unique<Connection>();
    conn->index = i;
    conn->fd = std::move(*fd);
    conns_.push_back(std::move(conn));
  }
  return absl::OkStatus();
}

void TcpPeer::Start() {
  last_progress_ns_ = NowNs();
  for (auto& conn : conns_) {
    Connection* raw = conn.get();
    raw->sender = std::thread([this, raw] { SendLoop(raw); });
    raw->acker = std::thread([this, raw] { AckLoop(raw); });
  }
  monitor_ = std::thread([this] { MonitorLoop(); });
}

TcpPeer::~TcpPeer() {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    stopping_ = true;
  }
  Close(absl::StrCat(Where(), ": peer closed"));
  state_cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  for (auto& conn : conns_) {
    if (conn->sender.joinable()) conn->sender.join();
    if (conn->acker.joinable()) conn->acker.join();
  }
}

absl::Status TcpPeer::AddRemoteRegion(const weightbeam::v1::RegionDescriptor& region) {
  for (const auto& key : region.keys()) {
    if (key.transport() != "tcp") continue;
    std::lock_guard<std::mutex> lock(remote_mu_);
    remote_regions_[region.region_id()] = RemoteRegion{key.key(), region.length()};
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(Where(), ": region ", region.region_id(),
                                                 " has no tcp key (registered elsewhere?)"));
}

void TcpPeer::RemoveRemoteRegion(uint64_t region_id) {
  std::lock_guard<std::mutex> lock(remote_mu_);
  remote_regions_.erase(region_id);
}

absl::Status TcpPeer::Validate(const std::vector<WriteOp>& ops, std::vector<Chunk>* chunks,
                               uint64_t* total) {
  chunks->reserve(ops.size());
  *total = 0;
  // A strided op is hundreds of writes from one local region into one remote region: each
  // region is looked up once per run of writes, and the context is formatted on failure only.
  std::optional<RegionInfo> local;
  const RemoteRegion* remote = nullptr;
  uint64_t remote_id = 0;
  auto context = [&](size_t i) { return absl::StrCat(Where(), ": write ", i); };
  std::lock_guard<std::mutex> lock(remote_mu_);
  for (size_t i = 0; i < ops.size(); ++i) {
    const WriteOp& op = ops[i];
    if (op.length == 0) continue;
    if (!local || local->id != op.local_region) {
      auto found = regions_->Find(op.local_region);
      if (!found.ok()) return WithContext(found.status(), context(i));
      local = *found;
    }
    if (op.local_offset > local->length || op.length > local->length - op.local_offset) {
      return absl::OutOfRangeError(absl::StrCat(context(i), ": local [", op.local_offset, ", +",
                                                op.length, ") is out of bounds of region ",
                                                op.local_region, " (length ", local->length, ")"));
    }
    if (remote == nullptr || remote_id != op.remote_region) {
      auto it = remote_regions_.find(op.remote_region);
      if (it == remote_regions_.end()) {
        return absl::NotFoundError(absl::StrCat(context(i), ": remote region ", op.remote_region,
                                                " is unknown (AddRemoteRegion first)"));
      }
      remote = &it->second;
      remote_id = op.remote_region;
    }
    if (op.remote_offset > remote->length || op.length > remote->length - op.remote_offset) {
      return absl::OutOfRangeError(absl::StrCat(
          context(i), ": remote [", op.remote_offset, ", +", op.length,
          ") is out of bounds of region ", op.remote_region, " (length ", remote->length, ")"));
    }
    chunks->push_back(Chunk{op.local_region, op.local_offset, op.remote_region, remote->key,
                            op.remote_offset, op.length, op.step});
    *total += op.length;
  }
  return absl::OkStatus();
}

std::vector<TcpPeer::Job> TcpPeer::Split(const std::shared_ptr<Batch>& batch,
                                         const std::vector<Chunk>& chunks, uint64_t total) const {
  const uint64_t num_conns = conns_.size();
  const uint64_t shares = std::clamp<uint64_t>(total / kMinShareBytes, 1, num_conns);
  const uint64_t share = (total + shares - 1) / shares;
  std::vector<Job> jobs(shares);
  uint64_t current = 0;
  uint64_t fill = 0;
  for (const Chunk& chunk : chunks) {
    uint64_t done = 0;
    while (done < chunk.length) {
      if (fill >= share && current + 1 < shares) {
        ++current;
        fill = 0;
      }
      uint64_t take = chunk.length - done;
      if (current + 1 < shares) take = std::min(take, share - fill);
      take = std::min(take, max_frame_bytes_);
      Chunk piece = chunk;
      piece.local_offset += done;
      piece.remote_offset += done;
      piece.length = take;
      jobs[current].chunks.push_back(piece);
      jobs[current].bytes += take;
      fill += take;
      done += take;
    }
  }
  jobs.erase(std::remove_if(jobs.begin(), jobs.end(), [](const Job& j) { return j.bytes == 0; }),
             jobs.end());
  // Rotate the starting connection so that small batches do not all queue on connection 0; a
  // batch of one share goes to the connection with the least waiting, ties by rotation.
  uint64_t first = batch->id % num_conns;
  if (jobs.size() == 1) {
    uint64_t least = conns_[first]->unsent.load(std::memory_order_relaxed);
    for (uint64_t i = 1; i < num_conns && least > 0; ++i) {
      const uint64_t c = (batch->id + i) % num_conns;
      const uint64_t waiting = conns_[c]->unsent.load(std::memory_order_relaxed);
      if (waiting < least) {
        least = waiting;
        first = c;
      }
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].batch = batch;
    jobs[i].conn = static_cast<int>((first + i) % num_conns);
    jobs[i].parts = static_cast<uint32_t>(jobs.size());
  }
  return jobs;
}

void TcpPeer::PostBatch(std::vector<WriteOp> ops, BatchDone done) {
  auto batch = std::make_shared<Batch>();
  batch->done = std::move(done);
  std::vector<Chunk> chunks;
  uint64_t total = 0;
  if (auto st = Validate(ops, &chunks, &total); !st.ok()) {
    Defer([this, batch, st] { Finish(batch, st); });
    return;
  }
  absl::Status broken;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    broken = broken_;
    if (broken.ok()) {
      batch->id = next_batch_id_++;
      if (active_.empty()) last_progress_ns_ = NowNs();
      active_[batch->id] = batch;
    }
  }
  if (!broken.ok()) {
    Defer([this, batch, broken] { Finish(batch, broken); });
    return;
  }
  std::vector<Job> jobs = Split(batch, chunks, total);
  if (jobs.empty()) {
    Defer([this, batch] { Finish(batch, absl::OkStatus()); });
    return;
  }
  batch->remaining = static_cast<int>(jobs.size());
  for (Job& job : jobs) {
    Connection* conn = conns_[job.conn].get();
    std::unique_lock<std::mutex> lock(conn->mu);
    if (conn->closed) {
      const absl::Status st =
          absl::UnavailableError(absl::StrCat(Where(), ": connection ", conn->index, " is closed"));
      Defer([this, batch, st] { Finish(batch, st); });
      break;
    }
    // Only on a connection with nothing in flight: a caller posting batch after batch (10^6
    // small ops) keeps handing them to the sender thread, which sends while it prepares more.
    conn->unsent.fetch_add(job.bytes, std::memory_order_relaxed);
    if (!conn->sending && conn->jobs.empty() && conn->awaiting_ack.empty() &&
        job.bytes <= kInlineSendBytes) {
      conn->sending = true;
      lock.unlock();
      SendInline(conn, std::move(job));
      continue;
    }
    conn->jobs.push_back(std::move(job));
    conn->cv.notify_one();
  }
}

void TcpPeer::SendInline(Connection* conn, Job job) {
  absl::Status st = SendJob(conn, job, /*inline_caller=*/true);
  conn->unsent.fetch_sub(job.bytes, std::memory_order_relaxed);
  bool queued;
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    conn->sending = false;
    queued = !conn->jobs.empty();
  }
  // Jobs queued meanwhile are the sender thread's again. Only then is it woken: it sleeps on
  // this condition, and a wake-up per inline send would cost the hand-off this path saves.
  if (queued) conn->cv.notify_one();
  if (st.ok()) return;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!broken_.ok()) st = broken_;
  }
  std::shared_ptr<Batch> batch = job.batch;
  Defer([this, conn, batch, st] {
    Finish(batch, st);
    FailConnection(conn, st);
  });
}

void TcpPeer::SendLoop(Connection* conn) {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(conn->mu);
      conn->cv.wait(lock, [&] { return conn->closed || (!conn->jobs.empty() && !conn->sending); });
      if (conn->closed) return;  // FailConnection fails what is queued
      job = std::move(conn->jobs.front());
      conn->jobs.pop_front();
      conn->sending = true;
    }
    absl::Status st = SendJob(conn, job, /*inline_caller=*/false);
    conn->unsent.fetch_sub(job.bytes, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(conn->mu);
      conn->sending = false;
    }
    if (!st.ok()) {
      {
        // Closed under us (stall detected, peer forgotten): that reason is the real one.
        std::lock_guard<std::mutex> lock(state_mu_);
        if (!broken_.ok()) st = broken_;
      }
      Finish(job.batch, st);
      FailConnection(conn, st);
      return;
    }
  }
}

size_t TcpPeer::GatherEnd(const std::vector<Chunk>& chunks, size_t first) const {
  const Chunk& head = chunks[first];
  if (head.length > kGatherRowBytes) return first + 1;
  uint64_t bytes = head.length;
  size_t end = first + 1;
  for (; end < chunks.size(); ++end) {
    const Chunk& prev = chunks[end - 1];
    const Chunk& c = chunks[end];
    if (c.length > kGatherRowBytes || c.local_region != head.local_region ||
        c.remote_region != head.remote_region || c.remote_key != head.remote_key ||
        c.step != head.step || c.remote_offset != prev.remote_offset + prev.length ||
        c.local_offset < prev.local_offset + prev.length || c.length > max_frame_bytes_ - bytes) {
      break;
    }
    bytes += c.length;
  }
  return end;
}

absl::Status TcpPeer::SendGathered(Connection* conn, const std::vector<Chunk>& chunks, size_t first,
                                   size_t end, const uint8_t* src, FrameHeader header,
                                   uint8_t* flush) {
  const Chunk& head = chunks[first];
  header.type = FrameType::kWrite;
  header.region_id = head.remote_region;
  header.key = head.remote_key;
  header.offset = head.remote_offset;
  header.length = 0;
  header.step = head.step;
  for (size_t i = first; i < end; ++i) header.length += chunks[i].length;
  uint8_t raw[kFrameHeaderBytes];
  EncodeFrameHeader(header, raw);
  std::vector<iovec> iov;
  iov.reserve(std::min(end - first, kGatherIovecs) + 2);
  iov.push_back({raw, sizeof(raw)});
  for (size_t i = first; i < end; ++i) {
    const Chunk& c = chunks[i];
    iov.push_back({const_cast<uint8_t*>(src) + (c.local_offset - head.local_offset), c.length});
    if (i + 1 == end && flush != nullptr) iov.push_back({flush, kFrameHeaderBytes});
    if (iov.size() >= kGatherIovecs || i + 1 == end) {
      if (auto st = net::SendAll(conn->fd.get(), iov.data(), static_cast<int>(iov.size()));
          !st.ok()) {
        return st;
      }
      last_progress_ns_ = NowNs();
      iov.clear();
    }
  }
  return absl::OkStatus();
}

absl::Status TcpPeer::SendJob(Connection* conn, Job& job, bool inline_caller) {
  // The share always ends with a FLUSH, so the receiver's bookkeeping of the batch completes.
  uint8_t flush[kFrameHeaderBytes];
  {
    FrameHeader header;
    header.type = FrameType::kFlush;
    header.batch_id = job.batch->id;
    header.aux = job.parts;
    header.offset = job.bytes;
    EncodeFrameHeader(header, flush);
  }
  // Awaited before any of it is on the wire (the ACK cannot come before the FLUSH), so that
  // the FLUSH can travel in the same send as the last write.
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    if (conn->closed) return absl::UnavailableError(absl::StrCat(Where(), ": connection closed"));
    conn->awaiting_ack.push_back(job.batch);
  }
  auto failed = [&](const absl::Status& st) {  // formatted on failure only: this is per job
    return WithContext(st, absl::StrCat(Where(), ": connection ", conn->index));
  };
  bool flushed = false;
  uint8_t raw[kFrameHeaderBytes];
  FrameHeader header;
  header.batch_id = job.batch->id;
  for (size_t i = 0; i < job.chunks.size(); ++i) {
    const Chunk& chunk = job.chunks[i];
    if (job.batch->finished) break;  // failed elsewhere: stop spending bandwidth on it
    if (const size_t end = GatherEnd(job.chunks, i); end > i + 1) {
      // Rows back to back at the receiver: one frame, the source span pinned once. A span the
      // table refuses (or GPU memory) goes row by row below, which names the row at fault.
      const Chunk& last = job.chunks[end - 1];
      auto span = regions_->PinLocal(chunk.local_region, chunk.local_offset,
                                     last.local_offset + last.length - chunk.local_offset);
      if (span.ok() && span->kind() == MemoryKind::kHost) {
        const bool with_flush = end == job.chunks.size();
        if (auto st = SendGathered(conn, job.chunks, i, end, span->data(), header,
                                   with_flush ? flush : nullptr);
            !st.ok()) {
          return failed(st);
        }
        flushed = with_flush;
        i = end - 1;
        continue;
      }
    }
    auto pin = regions_->PinLocal(chunk.local_region, chunk.local_offset, chunk.length);
    if (!pin.ok()) {
      absl::Status st = WithContext(pin.status(), Where());
      if (inline_caller) {
        Defer([this, batch = job.batch, st] { Finish(batch, st); });
      } else {
        Finish(job.batch, st);
      }
      break;
    }
    header.type = FrameType::kWrite;
    header.region_id = chunk.remote_region;
    header.key = chunk.remote_key;
    header.offset = chunk.remote_offset;
    header.length = chunk.length;
    header.step = chunk.step;
    EncodeFrameHeader(header, raw);
    if (pin->kind() == MemoryKind::kCuda) {
      absl::Status st =
          SendDevicePayload(conn->staging, conn->fd.get(), raw, sizeof(raw), pin->device(),
                            pin->data(), chunk.length, [this] { last_progress_ns_ = NowNs(); });
      if (!st.ok()) return failed(st);
      continue;
    }
    // Large payloads go out in slices so that the stall detector sees progress as it happens.
    uint64_t sent = std::min<uint64_t>(chunk.length, kSendSliceBytes);
    // The last write of the share carries the FLUSH along when it goes in one send: one
    // segment, one wake-up of the receiver, instead of two.
    const bool with_flush = i + 1 == job.chunks.size() && sent == chunk.length;
    iovec iov[3] = {{raw, sizeof(raw)}, {pin->data(), sent}, {flush, sizeof(flush)}};
    absl::Status st = net::SendAll(conn->fd.get(), iov, with_flush ? 3 : 2);
    flushed = with_flush && st.ok();
    while (st.ok()) {
      last_progress_ns_ = NowNs();
      if (sent == chunk.length) break;
      const uint64_t slice = std::min<uint64_t>(chunk.length - sent, kSendSliceBytes);
      st = net::SendAll(conn->fd.get(), pin->data() + sent, slice);
      sent += slice;
    }
    if (!st.ok()) return failed(st);
  }
  if (!flushed) {
    if (auto st = net::SendAll(conn->fd.get(), flush, sizeof(flush)); !st.ok()) {
      return failed(st);
    }
  }
  return absl::OkStatus();
}

void TcpPeer::AckLoop(Connection* conn) {
  const std::string context = absl::StrCat(Where(), ": connection ", conn->index);
  uint8_t raw[kFrameHeaderBytes];
  while (true) {
    size_t got = 0;
    int err = 0;
    net::RecvOutcome outcome = net::RecvExact(conn->fd.get(), raw, sizeof(raw), &got, &err);
    if (outcome != net::RecvOutcome::kOk) {
      FailConnection(conn, absl::UnavailableError(absl::StrCat(
                               context, ": ",
                               outcome == net::RecvOutcome::kClosed
                                   ? "connection closed by the peer"
                                   : absl::StrCat("connection lost: ", std::strerror(err)))));
      return;
    }
    auto header = ParseFrameHeader(raw, sizeof(raw));
    if (!header.ok()) {
      FailConnection(conn, WithContext(header.status(), absl::StrCat(context, ": bad reply")));
      return;
    }
    if (header->type == FrameType::kAck) {
      std::shared_ptr<Batch> batch;
      {
        std::lock_guard<std::mutex> lock(conn->mu);
        if (!conn->awaiting_ack.empty() && conn->awaiting_ack.front()->id == header->batch_id) {
          batch = std::move(conn->awaiting_ack.front());
          conn->awaiting_ack.pop_front();
        }
      }
      if (!batch) {
        FailConnection(conn, absl::InternalError(absl::StrCat(
                                 context, ": unexpected ACK for batch ", header->batch_id)));
        return;
      }
      last_progress_ns_ = NowNs();
      if (--batch->remaining == 0) Finish(batch, absl::OkStatus());
    } else if (header->type == FrameType::kNack) {
      std::string reason(header->length, '\0');
      if (net::RecvExact(conn->fd.get(), reason.data(), reason.size(), &got, &err) !=
          net::RecvOutcome::kOk) {
        FailConnection(conn, absl::UnavailableError(absl::StrCat(context, ": connection lost")));
        return;
      }
      std::shared_ptr<Batch> batch;
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        if (auto it = active_.find(header->batch_id); it != active_.end()) batch = it->second;
      }
      if (batch) {
        Finish(batch,
               absl::FailedPreconditionError(absl::StrCat(Where(), ": write refused: ", reason)));
      }
    } else {
      FailConnection(conn, absl::InternalError(absl::StrCat(
                               context, ": unexpected ", FrameTypeName(header->type), " frame")));
      return;
    }
  }
}

void TcpPeer::FailConnection(Connection* conn, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (broken_.ok()) {
      broken_ = status;
      if (!stopping_) spdlog::warn("{}", std::string(status.message()));
    }
  }
  std::deque<Job> jobs;
  std::deque<std::shared_ptr<Batch>> awaiting;
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    conn->closed = true;
    jobs.swap(conn->jobs);
    awaiting.swap(conn->awaiting_ack);
  }
  conn->cv.notify_all();
  ::shutdown(conn->fd.get(), SHUT_RDWR);  // wakes the other thread of this connection
  for (Job& job : jobs) Finish(job.batch, status);
  for (auto& batch : awaiting) Finish(batch, status);
}

void TcpPeer::Close(const std::string& reason) {
  const absl::Status status = absl::CancelledError(reason);
  for (auto& conn : conns_) FailConnection(conn.get(), status);
  std::vector<std::shared_ptr<Batch>> active;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    for (auto& [id, batch] : active_) active.push_back(batch);
  }
  for (auto& batch : active) Finish(batch, status);
}

void TcpPeer::Finish(const std::shared_ptr<Batch>& batch, absl::Status status) {
  if (batch->finished.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    active_.erase(batch->id);
  }
  if (batch->done) batch->done(std::move(status));
}

void TcpPeer::Defer(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    deferred_.push_back(std::move(fn));
  }
  state_cv_.notify_all();
}

void TcpPeer::MonitorLoop() {
  const auto tick = std::min<std::chrono::milliseconds>(
      std::chrono::milliseconds(100), options_.write_timeout / 4 + std::chrono::milliseconds(1));
  std::unique_lock<std::mutex> lock(state_mu_);
  while (true) {
    state_cv_.wait_for(lock, tick, [&] { return stopping_ || !deferred_.empty(); });
    while (!deferred_.empty()) {
      auto fn = std::move(deferred_.front());
      deferred_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
    if (stopping_) return;
    const int64_t idle_ns = NowNs() - last_progress_ns_;
    if (!active_.empty() &&
        idle_ns >
            std::chrono::duration_cast<std::chrono::nanoseconds>(options_.write_timeout).count()) {
      const size_t in_flight = active_.size();
      lock.unlock();
      const absl::Status status = absl::DeadlineExceededError(
          absl::StrCat(Where(), ": no progress for ", options_.write_timeout.count(), " ms with ",
                       in_flight, " batch(es) in flight; peer stalled or gone"));
      {
        std::lock_guard<std::mutex> state_lock(state_mu_);
        if (broken_.ok()) broken_ = status;
      }
      spdlog::warn("{}", std::string(status.message()));
      std::vector<std::shared_ptr<Batch>> active;
      {
        std::lock_guard<std::mutex> state_lock(state_mu_);
        for (auto& [id, batch] : active_) active.push_back(batch);
      }
      for (auto& batch : active) Finish(batch, status);
      for (auto& conn : conns_) FailConnection(conn.get(), status);
      lock.lock();
    }
  }
}

}  // namespace wb::transport::tcp
