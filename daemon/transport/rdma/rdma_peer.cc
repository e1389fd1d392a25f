#include "daemon/transport/rdma/rdma_peer.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "daemon/transport/rdma/chunk_plan.h"
#include "daemon/transport/rdma/landing_notice.h"
#include "daemon/transport/rdma/rdma_transport.h"

namespace wb::transport::rdma {

RdmaPeer::RdmaPeer(std::shared_ptr<RdmaState> state, std::string our_name, std::string name,
                   HandshakeExchange exchange, Handshaken connected)
    : state_(std::move(state)),
      our_name_(std::move(our_name)),
      name_(std::move(name)),
      exchange_(std::move(exchange)),
      connected_(std::move(connected)) {}

RdmaPeer::~RdmaPeer() {
  state_->engine->DestroyConnection(connected_.connection.id, "peer '" + name_ + "' closed");
}

absl::StatusOr<Handshaken> RdmaPeer::CurrentConnection() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!connected_.connection.broken->load()) return connected_;
  }
  std::lock_guard<std::mutex> reconnect(connect_mu_);
  uint64_t old_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!connected_.connection.broken->load()) return connected_;  // another thread did it
    old_id = connected_.connection.id;
  }
  absl::StatusOr<Handshaken> fresh = ConnectToPeer(*state_->engine, our_name_, name_, exchange_);
  if (!fresh.ok()) return fresh.status();
  state_->engine->DestroyConnection(old_id, "replaced after a failure");
  std::lock_guard<std::mutex> lock(mu_);
  connected_ = *fresh;
  return connected_;
}

absl::Status RdmaPeer::AddRemoteRegion(const weightbeam::v1::RegionDescriptor& region) {
  RemoteRegion remote;
  remote.length = region.length();
  for (const auto& key : region.keys()) {
    if (key.transport() != "rdma") continue;
    remote.keys[key.device()] = {key.address(), static_cast<uint32_t>(key.key())};
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& device : connected_.remote_devices) {
    if (remote.keys.count(device) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("region ", region.region_id(), " of peer '",
                                                     name_, "' has no rdma key for its device ",
                                                     device));
    }
  }
  regions_[region.region_id()] = std::move(remote);
  return absl::OkStatus();
}

void RdmaPeer::RemoveRemoteRegion(uint64_t region_id) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(region_id);
}

std::vector<std::vector<WriteOp>> SplitBatch(std::vector<WriteOp> ops, size_t max_writes) {
  std::vector<std::vector<WriteOp>> parts;
  if (ops.size() <= max_writes || max_writes == 0) {
    parts.push_back(std::move(ops));
    return parts;
  }
  for (size_t first = 0; first < ops.size(); first += max_writes) {
    const size_t last = std::min(ops.size(), first + max_writes);
    parts.emplace_back(std::make_move_iterator(ops.begin() + first),
                       std::make_move_iterator(ops.begin() + last));
  }
  return parts;
}

BatchDone JoinDone(size_t parts, BatchDone done) {
  struct Join {
    std::mutex mu;
    size_t left;
    absl::Status first;
    BatchDone done;
  };
  auto join = std::make_shared<Join>();
  join->left = parts;
  join->done = std::move(done);
  return [join](absl::Status s) {
    BatchDone finish;
    absl::Status result;
    {
      std::lock_guard<std::mutex> lock(join->mu);
      if (!s.ok() && join->first.ok()) join->first = std::move(s);
      if (--join->left > 0) return;
      finish = std::move(join->done);
      result = join->first;
    }
    finish(std::move(result));
  };
}

void RdmaPeer::PostBatch(std::vector<WriteOp> ops, BatchDone done) {
  // A strided op is one write per row: more than a receiver takes landing ranges for in one
  // batch goes as several batches, done once every one is.
  std::vector<std::vector<WriteOp>> parts = SplitBatch(std::move(ops), kMaxLandedRangesPerBatch);
  if (parts.size() == 1) {
    PostBounded(std::move(parts[0]), std::move(done));
    return;
  }
  BatchDone joined = JoinDone(parts.size(), std::move(done));
  for (auto& part : parts) PostBounded(std::move(part), joined);
}

void RdmaPeer::PostBounded(std::vector<WriteOp> ops, BatchDone done) {
  absl::StatusOr<Handshaken> connected = CurrentConnection();
  if (!connected.ok()) {
    done(connected.status());
    return;
  }
  const std::vector<std::string>& remote_devices = connected->remote_devices;
  const int rails = static_cast<int>(state_->engine->rails().size());
  const int qps = state_->engine->options().qps_per_rail;
  std::map<uint64_t, RdmaState::LocalView> locals;
  std::map<uint64_t, RemoteRegion> remotes;
  std::vector<LandedRange> landed;  // in the receiver's own addresses (its keys' address)
  uint64_t bytes = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const WriteOp& op = ops[i];
    if (locals.count(op.local_region) == 0) {
      absl::StatusOr<RdmaState::LocalView> local = state_->LookupLocal(op.local_region);
      if (!local.ok()) {
        done(absl::NotFoundError(
            absl::StrCat("write ", i, " to peer '", name_, "': ", local.status().message())));
        return;
      }
      locals[op.local_region] = *local;
    }
    if (remotes.count(op.remote_region) == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = regions_.find(op.remote_region);
      if (it == regions_.end()) {
        done(absl::NotFoundError(absl::StrCat("write ", i, " to peer '", name_,
                                              "': unknown remote region ", op.remote_region)));
        return;
      }
      remotes[op.remote_region] = it->second;
    }
    const auto& local = locals[op.local_region];
    const auto& remote = remotes[op.remote_region];
    if (op.local_offset > local.length || op.length > local.length - op.local_offset) {
      done(absl::OutOfRangeError(absl::StrCat(
          "write ", i, " to peer '", name_, "': out of bounds: local region ", op.local_region,
          " [", op.local_offset, ", +", op.length, ") exceeds its ", local.length, " bytes")));
      return;
    }
    if (local.windowed && !state_->LocalCovered(op.local_region, op.local_offset, op.length)) {
      done(absl::PermissionDeniedError(
          absl::StrCat("write ", i, " to peer '", name_, "': local [", op.local_offset, ", +",
                       op.length, ") of buffer region ", op.local_region,
                       " lies outside its registered tensors (withdrawn?); refused")));
      return;
    }
    if (op.remote_offset > remote.length || op.length > remote.length - op.remote_offset) {
      done(absl::OutOfRangeError(absl::StrCat(
          "write ", i, " to peer '", name_, "': out of bounds: remote region ", op.remote_region,
          " [", op.remote_offset, ", +", op.length, ") exceeds its ", remote.length, " bytes")));
      return;
    }
    bytes += op.length;
    if (op.length > 0 && !remote.keys.empty()) {
      landed.push_back({op.step, remote.keys.begin()->second.first + op.remote_offset, op.length});
    }
  }

  ChunkPlanOptions plan;
  plan.rails = rails;
  plan.qps_per_rail = qps;
  plan.chunk_bytes = state_->config.chunk_bytes;
  std::vector<Chunk> chunks = PlanChunks(ops, plan);
  std::vector<WorkRequest> wrs;
  wrs.reserve(chunks.size());
  for (const Chunk& c : chunks) {
    const auto& local = locals[c.local_region];
    const auto& key = remotes[c.remote_region].keys.find(remote_devices[c.rail * qps + c.qp]);
    if (key == remotes[c.remote_region].keys.end()) {
      done(absl::FailedPreconditionError(
          absl::StrCat("remote region ", c.remote_region, " of peer '", name_,
                       "' has no rdma key for its device ", remote_devices[c.rail * qps + c.qp])));
      return;
    }
    WorkRequest wr;
    wr.qp = c.rail * qps + c.qp;
    wr.local_addr = local.addr + c.local_offset;
    wr.lkey = local.lkeys[c.rail];
    wr.remote_addr = key->second.first + c.remote_offset;
    wr.rkey = key->second.second;
    wr.length = static_cast<uint32_t>(c.length);
    wrs.push_back(wr);
  }
  // The last write carries the immediate; an empty batch still sends a zero-length one so the
  // receiver sees the arrival.
  WorkRequest last;
  if (!wrs.empty()) {
    last = wrs.back();
    wrs.pop_back();
  }
  state_->engine->Submit(connected->connection.id, std::move(wrs), last, bytes,
                         MergeRanges(std::move(landed)), std::move(done));
}

}  // namespace wb::transport::rdma
