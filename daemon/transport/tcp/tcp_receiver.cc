#include "daemon/transport/tcp/tcp_receiver.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/transport/tcp/gpu_io.h"
#include "weightbeam/v1/transport.pb.h"

namespace wb::transport::tcp {
namespace {

std::string HostText(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, host, sizeof(host));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, host,
              sizeof(host));
  }
  return host;
}

std::string AddressText(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return net::FormatHostPort(host, port);
}

constexpr size_t kTokenBytes = 16;

// No early exit: how long a HELLO takes to be refused says nothing about the issued tokens.
bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |=
        static_cast<unsigned>(static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}
// Each connection costs a thread; unauthenticated ones wait up to the handshake timeout for
// HELLO and are capped per source address.
constexpr size_t kMaxConnections = 1024;

// accept() failing for lack of descriptors or memory is transient: the connection stays in the
// backlog and accepting resumes once some are freed.
bool OutOfResources(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

// Logs the 1st, 2nd, 4th, 8th ... occurrence: a flood leaves a trace without flooding the log.
bool PowerOfTwo(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

}  // namespace

TcpReceiver::TcpReceiver(std::shared_ptr<RegionTable> regions, TcpOptions options)
    : regions_(std::move(regions)), options_(std::move(options)) {}

TcpReceiver::~TcpReceiver() {
  stopping_ = true;
  if (listen_fd_.valid()) ::shutdown(listen_fd_.get(), SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (auto& conn : conns_) ::shutdown(conn->fd.get(), SHUT_RDWR);
  for (auto& conn : conns_) {
    if (conn->thread.joinable()) conn->thread.join();
  }
}

absl::Status TcpReceiver::Start() {
  auto where = net::ParseHostPort(options_.listen);
  if (!where.ok()) return where.status();
  auto fd = net::ListenTcp(*where, &port_);
  if (!fd.ok())
    return absl::Status(fd.status().code(), absl::StrCat("tcp transport: ", fd.status().message()));
  listen_fd_ = std::move(*fd);
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

std::string TcpReceiver::IssueToken(const std::string& peer) {
  std::string token(kTokenBytes, '\0');
  for (size_t i = 0; i < kTokenBytes; i += 8) {
    uint64_t r = RandomU64();
    std::memcpy(&token[i], &r, 8);
  }
  std::lock_guard<std::mutex> lock(peers_mu_);
  if (auto old = peer_to_token_.find(peer); old != peer_to_token_.end()) {
    token_to_peer_.erase(old->second);
  }
  peer_to_token_[peer] = token;
  token_to_peer_[token] = peer;
  return token;
}

void TcpReceiver::ForgetPeer(const std::string& peer) {
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (auto it = peer_to_token_.find(peer); it != peer_to_token_.end()) {
      token_to_peer_.erase(it->second);
      peer_to_token_.erase(it);
    }
    for (auto it = batches_.lower_bound({peer, 0});
         it != batches_.end() && it->first.first == peer;) {
      EraseBatchLocked(it++);
    }
  }
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (auto& conn : conns_) {
    if (conn->peer == peer) ::shutdown(conn->fd.get(), SHUT_RDWR);
  }
}

size_t TcpReceiver::OpenBatches() {
  std::lock_guard<std::mutex> lock(peers_mu_);
  return batches_.size();
}

void TcpReceiver::SetPeerEndedCallback(PeerEndedCallback cb) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  peer_ended_ = std::move(cb);
}

void TcpReceiver::SetLandingCallback(LandingCallback cb) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  landing_ = std::move(cb);
}

void TcpReceiver::SetArrivalCallback(ArrivalCallback cb) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  arrival_ = std::move(cb);
}

absl::Status TcpReceiver::OpenStep(uint64_t step) {
  absl::Status st = fence_.Open(step, [this, step] { CutLanding(true, step); });
  DropFencedBatches();
  return st;
}

absl::Status TcpReceiver::CloseStep() {
  absl::Status st = fence_.Close([this] { CutLanding(false, 0); });
  DropFencedBatches();
  return st;
}

TcpReceiver::BatchProgress& TcpReceiver::BatchLocked(const BatchKey& key) {
  auto it = batches_.find(key);
  if (it != batches_.end()) return it->second;
  size_t& open = open_batches_[key.first];
  if (open >= kMaxOpenBatchesPerPeer) {
    // The peer's lowest batch id: a sender numbers its batches in order, so its oldest.
    static std::atomic<uint64_t> evicted{0};
    if (PowerOfTwo(++evicted)) {
      spdlog::warn(
          "tcp transport: '{}' has {} batches without their FLUSH (max {}): forgetting the "
          "oldest ({} so far)",
          key.first, open, kMaxOpenBatchesPerPeer, evicted.load());
    }
    EraseBatchLocked(batches_.lower_bound({key.first, 0}));
  }
  ++open_batches_[key.first];
  BatchProgress& progress = batches_[key];
  progress.epoch = fence_epoch_;
  return progress;
}

void TcpReceiver::EraseBatchLocked(std::map<BatchKey, BatchProgress>::iterator it) {
  auto open = open_batches_.find(it->first.first);
  if (open != open_batches_.end() && --open->second == 0) open_batches_.erase(open);
  batches_.erase(it);
}

void TcpReceiver::DropFencedBatches() {
  std::lock_guard<std::mutex> lock(peers_mu_);
  ++fence_epoch_;
  for (auto it = batches_.begin(); it != batches_.end();) {
    if (it->second.epoch < fence_epoch_) {
      EraseBatchLocked(it++);
    } else {
      ++it;
    }
  }
}

void TcpReceiver::ConnectionEnded(const std::string& peer) {
  PeerEndedCallback ended;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    auto live = live_connections_.find(peer);
    if (live == live_connections_.end() || --live->second > 0) return;
    live_connections_.erase(live);
    for (auto it = batches_.lower_bound({peer, 0});
         it != batches_.end() && it->first.first == peer;) {
      EraseBatchLocked(it++);
    }
    ended = peer_ended_;
  }
  if (ended) ended(peer);
}

void TcpReceiver::CutLanding(bool keep_any, uint64_t keep) {
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (auto& conn : conns_) {
    const uint64_t step = conn->landing_step;
    if (conn->landing && !(keep_any && step == keep)) {
      spdlog::warn(
          "tcp transport: cutting the connection from '{}' ({}): it is landing a write "
          "of step {}, which is over",
          conn->peer, conn->remote, step);
      ::shutdown(conn->fd.get(), SHUT_RDWR);
    }
  }
}

void TcpReceiver::ReapFinished() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->finished) {
      (*it)->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpReceiver::CapUnauthenticated(const std::string& source) {
  Connection* oldest = nullptr;
  int waiting = 0;
  for (auto& conn : conns_) {
    if (conn->finished || !conn->peer.empty() || conn->source != source) continue;
    if (oldest == nullptr) oldest = conn.get();
    ++waiting;
  }
  if (waiting < options_.max_unauthenticated_per_source || oldest == nullptr) return;
  static std::atomic<uint64_t> evicted{0};
  if (PowerOfTwo(++evicted)) {
    spdlog::warn(
        "tcp transport: {} connections from {} without a valid HELLO (max {}): closing the "
        "oldest, {} ({} so far)",
        waiting, source, options_.max_unauthenticated_per_source, oldest->remote, evicted.load());
  }
  ::shutdown(oldest->fd.get(), SHUT_RDWR);
  oldest->source.clear();  // counted no more; its thread finishes on its own
}

void TcpReceiver::AcceptLoop() {
  auto backoff = std::chrono::milliseconds(10);
  uint64_t resource_failures = 0;
  while (!stopping_) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (stopping_) return;
      if (OutOfResources(err)) {
        if (PowerOfTwo(++resource_failures)) {
          spdlog::error("tcp transport: accept failed ({} times): {}; retrying in {} ms",
                        resource_failures, std::strerror(err), backoff.count());
        }
        {
          std::lock_guard<std::mutex> lock(conns_mu_);
          ReapFinished();  // finished connections give their descriptors back
        }
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
        continue;
      }
      spdlog::error("tcp transport: accept failed, data connections are no longer accepted: {}",
                    std::strerror(err));
      return;
    }
    backoff = std::chrono::milliseconds(10);
    auto conn = std::make_unique<Connection>();
    conn->fd = net::UniqueFd(fd);
    conn->remote = AddressText(addr);
    conn->source = HostText(addr);
    // Until the HELLO, receives are bounded by the handshake timeout.
    if (auto st = net::TuneSocket(fd, options_.socket_buffer_bytes, options_.write_timeout,
                                  options_.handshake_timeout);
        !st.ok()) {
      spdlog::error("tcp transport: connection from {}: {}", conn->remote,
                    std::string(st.message()));
      continue;
    }
    std::lock_guard<std::mutex> lock(conns_mu_);
    ReapFinished();
    if (stopping_) return;
    CapUnauthenticated(conn->source);
    if (conns_.size() >= kMaxConnections) {
      spdlog::error("tcp transport: refusing connection from {}: {} connections open", conn->remote,
                    conns_.size());
      continue;
    }
    Connection* raw = conn.get();
    conns_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

absl::Status TcpReceiver::ReadHeader(Connection* conn, FrameHeader* header, bool* closed) {
  uint8_t raw[kFrameHeaderBytes];
  size_t have = 0;
  *closed = false;
  while (have < kFrameHeaderBytes) {
    size_t got = 0;
    int err = 0;
    // A header that has begun must be complete within the write timeout (however slowly its
    // bytes trickle in); idle time before it does not count. Before the HELLO: the handshake
    // timeout.
    const auto deadline =
        std::chrono::steady_clock::now() +
        (conn->peer.empty() ? options_.handshake_timeout : options_.write_timeout);
    net::RecvOutcome outcome =
        net::RecvExactBy(conn->fd.get(), raw + have, sizeof(raw) - have, deadline, &got, &err);
    have += got;
    if (outcome == net::RecvOutcome::kOk) break;
    if (outcome == net::RecvOutcome::kTimedOut) {
      // Idle between frames is fine once the peer is known; a stall inside a header is not.
      if (have == 0 && !conn->peer.empty() && !stopping_) continue;
      return absl::DeadlineExceededError(
          conn->peer.empty()
              ? absl::StrCat("no HELLO within ", options_.handshake_timeout.count(), " ms (", have,
                             " bytes of its header arrived)")
              : absl::StrCat("no complete frame header within ", options_.write_timeout.count(),
                             " ms (", have, " bytes arrived)"));
    }
    if (outcome == net::RecvOutcome::kClosed && have == 0) {
      *closed = true;
      return absl::OkStatus();
    }
    return absl::UnavailableError(
        outcome == net::RecvOutcome::kClosed
            ? absl::StrCat("connection closed inside a frame header (", have, " bytes)")
            : absl::StrCat("receive failed: ", std::strerror(err)));
  }
  auto parsed = ParseFrameHeader(raw, sizeof(raw));
  if (!parsed.ok()) return parsed.status();
  *header = *parsed;
  return absl::OkStatus();
}

absl::Status TcpReceiver::SendControl(Connection* conn, FrameType type, uint64_t batch_id,
                                      const std::string& payload) {
  FrameHeader header;
  header.type = type;
  header.batch_id = batch_id;
  header.length = std::min<uint64_t>(payload.size(), kMaxControlPayload);
  uint8_t raw[kFrameHeaderBytes];
  EncodeFrameHeader(header, raw);
  iovec iov[2] = {{raw, sizeof(raw)}, {const_cast<char*>(payload.data()), header.length}};
  return net::SendAll(conn->fd.get(), iov, header.length > 0 ? 2 : 1);
}

absl::Status TcpReceiver::Handshake(Connection* conn) {
  const auto deadline = std::chrono::steady_clock::now() + options_.handshake_timeout;
  FrameHeader header;
  bool closed = false;
  if (auto st = ReadHeader(conn, &header, &closed); !st.ok()) return st;
  if (closed) return absl::UnavailableError("closed before HELLO");
  if (header.type != FrameType::kHello) {
    return absl::InvalidArgumentError(
        absl::StrCat("first frame is ", FrameTypeName(header.type), ", expected HELLO"));
  }
  std::string payload(header.length, '\0');
  size_t got = 0;
  if (net::RecvExactBy(conn->fd.get(), payload.data(), payload.size(), deadline, &got, nullptr) !=
      net::RecvOutcome::kOk) {
    return absl::UnavailableError(absl::StrCat("HELLO payload not complete within ",
                                               options_.handshake_timeout.count(), " ms (", got,
                                               " of ", payload.size(), " bytes)"));
  }
  weightbeam::v1::TcpHello hello;
  if (!hello.ParseFromString(payload)) return absl::InvalidArgumentError("HELLO is not a TcpHello");
  std::string peer;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    // Every issued token is compared (a map lookup would stop at the first differing byte).
    for (const auto& [name, token] : peer_to_token_) {
      if (ConstantTimeEqual(token, hello.token())) peer = name;
    }
    if (peer.empty()) {
      return absl::PermissionDeniedError(
          absl::StrCat("unknown token from '", hello.from_agent(), "' (not introduced by Accept)"));
    }
  }
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    conn->peer = peer;
  }
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    ++live_connections_[peer];
  }
  // Authenticated: from now on receives are bounded by the write timeout.
  if (auto st = net::TuneSocket(conn->fd.get(), options_.socket_buffer_bytes,
                                options_.write_timeout, options_.write_timeout);
      !st.ok()) {
    return st;
  }
  return SendControl(conn, FrameType::kAck, 0, "");
}

absl::Status TcpReceiver::DiscardPayload(Connection* conn, uint64_t length) {
  std::vector<uint8_t> sink(std::min<uint64_t>(length, 256 << 10));
  const auto deadline = std::chrono::steady_clock::now() + options_.write_timeout;
  while (length > 0) {
    size_t want = std::min<uint64_t>(length, sink.size());
    size_t got = 0;
    if (net::RecvExactBy(conn->fd.get(), sink.data(), want, deadline, &got, nullptr) !=
        net::RecvOutcome::kOk) {
      return absl::UnavailableError("connection lost while discarding a refused payload");
    }
    length -= want;
  }
  return absl::OkStatus();
}

absl::Status TcpReceiver::HandleWrite(Connection* conn, const FrameHeader& header) {
  if (header.length > options_.max_frame_bytes) {
    std::string reason = absl::StrCat("WRITE frame of ", header.length,
                                      " bytes exceeds max_frame_bytes ", options_.max_frame_bytes);
    SendControl(conn, FrameType::kNack, header.batch_id, reason).IgnoreError();
    return absl::InvalidArgumentError(reason);
  }
  // The step fence first: a write of any step but the open one never touches memory, and the
  // fence cannot move on while this one lands (the pass is held until the payload is in).
  StepFence::Pass pass;
  if (auto admitted = fence_.Admit(header.step, conn->peer, &pass); !admitted.ok()) {
    {
      std::lock_guard<std::mutex> lock(peers_mu_);
      BatchLocked({conn->peer, header.batch_id}).rejected = true;
    }
    if (auto st =
            SendControl(conn, FrameType::kNack, header.batch_id, std::string(admitted.message()));
        !st.ok()) {
      return st;
    }
    return DiscardPayload(conn, header.length);
  }
  auto pin = regions_->PinRemoteWrite(header.region_id, header.key, header.offset, header.length);
  if (!pin.ok()) {
    // Refused before touching memory: drop the bytes, tell the sender why, keep serving.
    spdlog::warn("tcp transport: refused write from '{}' ({}): {}", conn->peer, conn->remote,
                 std::string(pin.status().message()));
    {
      std::lock_guard<std::mutex> lock(peers_mu_);
      BatchLocked({conn->peer, header.batch_id}).rejected = true;
    }
    if (auto st = SendControl(conn, FrameType::kNack, header.batch_id,
                              std::string(pin.status().message()));
        !st.ok()) {
      return st;
    }
    return DiscardPayload(conn, header.length);
  }
  size_t got = 0;
  int err = 0;
  // The whole payload within the write timeout, not merely some progress within it, into host
  // memory and through the pinned staging ring into GPU memory alike.
  const auto deadline = std::chrono::steady_clock::now() + options_.write_timeout;
  absl::Status staging_error;
  conn->landing_step = header.step;
  conn->landing = true;
  net::RecvOutcome outcome =
      pin->kind() == MemoryKind::kCuda
          ? RecvDevicePayload(conn->staging, conn->fd.get(), pin->device(), pin->data(),
                              header.length, deadline, &got, &err, &staging_error)
          : net::RecvExactBy(conn->fd.get(), pin->data(), header.length, deadline, &got, &err);
  conn->landing = false;
  if (!staging_error.ok()) return staging_error;
  if (outcome != net::RecvOutcome::kOk) {
    return absl::UnavailableError(absl::StrCat(
        "payload of region ", header.region_id, " [", header.offset, ", +", header.length,
        ") cut off after ", got, " bytes: ",
        outcome == net::RecvOutcome::kClosed     ? "connection closed"
        : outcome == net::RecvOutcome::kTimedOut ? "not complete within the write timeout"
                                                 : std::strerror(err)));
  }
  LandingCallback landing;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    BatchLocked({conn->peer, header.batch_id}).bytes += header.length;
    landing = landing_;
  }
  // Still under the fence's pass and the region's pin: the bytes are in and stay valid.
  if (landing) landing(header.step, pin->data(), header.length);
  return absl::OkStatus();
}

absl::Status TcpReceiver::HandleFlush(Connection* conn, const FrameHeader& header) {
  ArrivalCallback arrival;
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    const BatchKey key(conn->peer, header.batch_id);
    BatchProgress& progress = BatchLocked(key);
    if (++progress.parts_seen >= header.aux) {
      if (!progress.rejected) {
        arrival = arrival_;
        bytes = progress.bytes;
      }
      EraseBatchLocked(batches_.find(key));
    }
  }
  // Acknowledge first: the sender's batch completes without waiting for our callback.
  if (auto st = SendControl(conn, FrameType::kAck, header.batch_id, ""); !st.ok()) return st;
  if (arrival) arrival(conn->peer, bytes);
  return absl::OkStatus();
}

void TcpReceiver::Serve(Connection* conn) {
  absl::Status status = Handshake(conn);
  if (!status.ok()) {
    spdlog::warn("tcp transport: closing connection from {}: {}", conn->remote,
                 std::string(status.message()));
  }
  while (status.ok()) {
    FrameHeader header;
    bool closed = false;
    status = ReadHeader(conn, &header, &closed);
    if (!status.ok() || closed) break;
    switch (header.type) {
      case FrameType::kWrite:
        status = HandleWrite(conn, header);
        break;
      case FrameType::kFlush:
        status = HandleFlush(conn, header);
        break;
      default:
        status = absl::InvalidArgumentError(
            absl::StrCat("unexpected ", FrameTypeName(header.type), " frame"));
    }
  }
  if (!status.ok() && !conn->peer.empty() && !stopping_) {
    spdlog::error("tcp transport: closing connection from '{}' ({}): {}", conn->peer, conn->remote,
                  std::string(status.message()));
  }
  ::shutdown(conn->fd.get(), SHUT_RDWR);
  // Batches of a peer with no connection left never see their FLUSH (the sender failed them).
  // Before `finished`: the connection may be reaped (its thread joined) right after.
  if (!conn->peer.empty()) ConnectionEnded(conn->peer);
  conn->finished = true;
}

}  // namespace wb::transport::tcp
