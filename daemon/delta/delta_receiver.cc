#include "daemon/delta/delta_receiver.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parallel/parallel_for.h"
#include "daemon/registry/bus_guard.h"

namespace wb::delta {

namespace v1 = weightbeam::v1;

namespace {

std::string OpName(const std::string& src_agent, const v1::TransferOp& op) {
  return absl::StrCat("op ", op.op_id(), " from ", src_agent, " (tensor ", op.dst_tensor(), ")");
}

// A host destination cut short under us (SIGBUS inside the guard).
absl::Status ShrunkError(const std::string& agent, const std::string& src_agent,
                         const v1::TransferOp& op) {
  return absl::DataLossError(absl::StrCat(
      "destination tensor '", op.dst_tensor(), "' on agent ", agent, " (", OpName(src_agent, op),
      "): its memory could not be accessed (SIGBUS: its owner shrank the shared-memory object "
      "under the registered range); re-register it"));
}

// Slots applied (and hashed) at once: a few threads, fewer on smaller machines.
int ApplyThreads() { return static_cast<int>(std::min(4u, std::thread::hardware_concurrency())); }

}  // namespace

DeltaReceiver::DeltaReceiver(std::string agent, std::vector<transport::Transport*> transports,
                             const registry::RegionRegistry* registry, DeltaReceiverOptions options)
    : agent_(std::move(agent)),
      transports_(std::move(transports)),
      registry_(registry),
      fail_commit_version_(options.fail_commit_version) {}

DeltaReceiver::~DeltaReceiver() {
  absl::MutexLock lock(&mu_);
  Release();
}

void DeltaReceiver::Release() {
  for (auto* t : transports_) {
    auto it = transport_regions_.find(t->Name());
    if (it != transport_regions_.end()) (void)t->Deregister(it->second);
  }
  transport_regions_.clear();
  if (memory_) munmap(memory_, length_);
  memory_ = nullptr;
  length_ = 0;
  incoming_.clear();
  by_op_.clear();
}

absl::Status DeltaReceiver::Load(const v1::AgentPlan& plan, v1::LoadPlanResponse* resp) {
  std::vector<Incoming> incoming;
  uint64_t total = 0;
  for (const auto& in : plan.incoming()) {
    const v1::TransferOp& op = in.op();
    Incoming x{in.src_agent(), op, LayoutOf(op), 0, 0};
    const bool fp8 = op.transform() == v1::TRANSFORM_FP8_BLOCK;
    for (bool scales : {false, true}) {
      if (scales && !fp8) continue;
      const uint64_t region = scales ? op.scale_region() : op.dst_region();
      auto t = registry_->Find(region);
      if (!t) {
        return absl::FailedPreconditionError(
            absl::StrCat("delta mode: ", OpName(in.src_agent(), op), ": destination region ",
                         region, " is not registered on agent ", agent_));
      }
      if (t->memory.kind != transport::MemoryKind::kHost) {
        if (absl::Status gpu = GpuScatterAvailable(); !gpu.ok()) {
          return absl::UnimplementedError(absl::StrCat(
              "delta mode: destination tensor '", t->spec.name(), "' on agent ", agent_, " is in ",
              t->location, " memory and deltas cannot be applied to GPU memory here: ",
              gpu.message(), " (set the controller's delta.enabled: false)"));
        }
      }
      for (const Segment& s : x.layout.segments) {
        if (s.scales == scales && s.dst_offset + s.length > t->memory.length) {
          return absl::OutOfRangeError(absl::StrCat("delta mode: ", OpName(in.src_agent(), op),
                                                    " reaches past the end of tensor '",
                                                    t->spec.name(), "'"));
        }
      }
    }
    const uint64_t payload =
        static_cast<uint64_t>(plan.delta().receive_fraction() * x.layout.dense_bytes);
    x.capacity = (kSlotHeaderBytes + payload + 63) / 64 * 64;
    x.slot_offset = total;
    total += x.capacity;
    incoming.push_back(std::move(x));
  }
  absl::MutexLock lock(&mu_);
  Release();
  if (incoming.empty()) return absl::OkStatus();
  void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("delta mode: cannot allocate a ", total, "-byte receive region"));
  }
  memory_ = static_cast<uint8_t*>(mem);
  length_ = total;
  const uint64_t region_id = kReceiveRegionBase + plan.plan_id();
  v1::RegionDescriptor* desc = resp->mutable_delta_region();
  desc->set_region_id(region_id);
  desc->set_length(total);
  for (auto* t : transports_) {
    auto d = t->Register({memory_, total, transport::MemoryKind::kHost, -1},
                         transport::Access::kDestination);
    if (!d.ok()) {
      Release();
      return absl::Status(d.status().code(),
                          absl::StrCat("delta mode: registering the receive region with ",
                                       t->Name(), ": ", d.status().message()));
    }
    transport_regions_[t->Name()] = d->region_id();
    for (auto key : d->keys()) {
      key.set_transport_region(d->region_id());
      if (key.transport().empty()) key.set_transport(t->Name());
      *desc->add_keys() = key;
    }
  }
  for (size_t i = 0; i < incoming.size(); ++i) {
    const Incoming& x = incoming[i];
    v1::DeltaSlot* slot = resp->add_delta_slots();
    slot->set_src_agent(x.src_agent);
    slot->set_op_id(x.op.op_id());
    slot->set_dst_agent(agent_);
    slot->set_region_id(region_id);
    slot->set_offset(x.slot_offset);
    slot->set_capacity(x.capacity);
    by_op_[{x.src_agent, x.op.op_id()}] = i;
  }
  incoming_ = std::move(incoming);
  spdlog::info("delta mode: receive region of {} bytes for {} incoming op(s)", total,
               incoming_.size());
  return absl::OkStatus();
}

absl::Status DeltaReceiver::ApplySlot(const Incoming& in, uint64_t version, uint64_t nonce,
                                      bool* applied, uint64_t* payload) const {
  *applied = false;
  const uint8_t* slot = memory_ + in.slot_offset;
  const SlotHeader h = ReadSlotHeader(slot);
  if (h.magic != kSlotMagic || h.version != version || h.nonce != nonce) return absl::OkStatus();
  if (h.op_id != in.op.op_id() || h.payload_bytes > in.capacity - kSlotHeaderBytes) {
    return absl::DataLossError(absl::StrCat("delta slot of ", OpName(in.src_agent, in.op),
                                            " is corrupt (op id ", h.op_id, ", ", h.payload_bytes,
                                            " payload bytes in a ", in.capacity, "-byte slot)"));
  }
  auto dst = registry_->Find(in.op.dst_region());
  std::shared_ptr<const registry::RegisteredTensor> scales;
  if (in.op.transform() == v1::TRANSFORM_FP8_BLOCK) scales = registry_->Find(in.op.scale_region());
  if (!dst || (in.op.transform() == v1::TRANSFORM_FP8_BLOCK && !scales)) {
    return absl::FailedPreconditionError(absl::StrCat("delta mode: ", OpName(in.src_agent, in.op),
                                                      ": destination withdrawn before commit"));
  }
  const auto packed = absl::MakeConstSpan(slot + kSlotHeaderBytes, h.payload_bytes);
  const DestinationMemory dst_mem = MemoryOf(dst.get());
  const DestinationMemory scale_mem = MemoryOf(scales.get());
  absl::Status s;
  if (!dst_mem.on_device && !scale_mem.on_device) {
    // Host fast path, into the inference process's shared memory: under the SIGBUS guard (it
    // may have shrunk its object since it registered).
    if (!registry::RunBusGuarded(
            [&] { s = ApplyToDestination(packed, in.layout, dst_mem.addr, scale_mem.addr); })) {
      s = ShrunkError(agent_, in.src_agent, in.op);
    }
  } else {
    auto list = ResolveDelta(packed, in.layout);
    s = list.ok() ? gpu_.Scatter(*list, dst_mem, scale_mem, in.op.dst_tensor()) : list.status();
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("applying the delta of ",
                                               OpName(in.src_agent, in.op), ": ", s.message()));
  }
  *applied = true;
  *payload = h.payload_bytes;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DeltaReceiver::DestinationHash(const Incoming& in) const {
  auto dst = registry_->Find(in.op.dst_region());
  std::shared_ptr<const registry::RegisteredTensor> scales;
  if (in.op.transform() == v1::TRANSFORM_FP8_BLOCK) scales = registry_->Find(in.op.scale_region());
  if (!dst || (in.op.transform() == v1::TRANSFORM_FP8_BLOCK && !scales)) {
    return absl::FailedPreconditionError(
        absl::StrCat(OpName(in.src_agent, in.op), ": destination withdrawn before commit"));
  }
  const DestinationMemory dst_mem = MemoryOf(dst.get());
  const DestinationMemory scale_mem = MemoryOf(scales.get());
  if (!dst_mem.on_device && !scale_mem.on_device) {
    uint64_t hash = 0;
    if (!registry::RunBusGuarded(
            [&] { hash = HashDestination(in.layout, dst_mem.addr, scale_mem.addr); })) {
      return absl::DataLossError(
          absl::StrCat("verification: ", ShrunkError(agent_, in.src_agent, in.op).message()));
    }
    return hash;
  }
  return gpu_.Hash(in.layout, dst_mem, scale_mem, in.op.dst_tensor());
}

DestinationMemory DeltaReceiver::MemoryOf(const registry::RegisteredTensor* t) {
  if (!t) return {};
  return {static_cast<uint8_t*>(t->memory.addr), t->memory.kind == transport::MemoryKind::kCuda,
          t->memory.device};
}

absl::Status DeltaReceiver::Apply(uint64_t version, uint64_t nonce,
                                  const std::vector<v1::OpHash>& expected, ApplyStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  std::vector<absl::Status> errors(incoming_.size());
  std::vector<uint64_t> payload(incoming_.size(), 0);
  std::vector<char> applied(incoming_.size(), 0);
  // Test hook: fail the commit with only part of the deltas applied (a partially patched
  // destination that must never be built upon).
  const bool inject = fail_commit_version_ != 0 && fail_commit_version_ == version;
  size_t limit = incoming_.size();
  if (inject) limit = incoming_.size() / 2;
  ParallelFor(limit, ApplyThreads(), [&](uint64_t i) {
    bool a = false;
    errors[i] = ApplySlot(incoming_[i], version, nonce, &a, &payload[i]);
    applied[i] = a;
  });
  std::vector<std::string> messages;
  for (size_t i = 0; i < limit; ++i) {
    if (!errors[i].ok()) messages.emplace_back(errors[i].message());
    if (applied[i]) {
      ++stats->slots_applied;
      stats->payload_bytes += payload[i];
      stats->dense_bytes += incoming_[i].layout.dense_bytes;
    }
  }
  if (inject) {
    messages.push_back(absl::StrCat("injected failure (delta.test_fail_commit_version=", version,
                                    ") after applying ", stats->slots_applied, " delta slot(s)"));
  }
  if (!messages.empty()) {
    if (messages.size() > 4) {
      const size_t more = messages.size() - 4;
      messages.resize(4);
      messages.push_back(absl::StrCat("and ", more, " more"));
    }
    return absl::DataLossError(absl::StrJoin(messages, "; "));
  }
  // Verification: the sender's hash of what each destination must hold now.
  std::vector<std::pair<size_t, uint64_t>> checks;
  for (const auto& h : expected) {
    if (h.dst_agent() != agent_) continue;
    auto it = by_op_.find({h.src_agent(), h.op_id()});
    if (it == by_op_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("verification: op ", h.op_id(), " from ",
                                                        h.src_agent(),
                                                        " is not an incoming op of this plan"));
    }
    checks.push_back({it->second, h.hash()});
  }
  std::vector<char> mismatch(checks.size(), 0);
  std::vector<absl::Status> hash_errors(checks.size());
  ParallelFor(checks.size(), ApplyThreads(), [&](uint64_t i) {
    auto got = DestinationHash(incoming_[checks[i].first]);
    if (!got.ok()) {
      hash_errors[i] = got.status();
    } else if (*got != checks[i].second) {
      mismatch[i] = 1;
    }
  });
  std::vector<std::string> bad;
  for (size_t i = 0; i < checks.size(); ++i) {
    if (!hash_errors[i].ok()) return hash_errors[i];
    if (mismatch[i]) {
      const Incoming& in = incoming_[checks[i].first];
      bad.push_back(
          absl::StrCat(in.op.dst_tensor(), " (op ", in.op.op_id(), " from ", in.src_agent, ")"));
    }
  }
  stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!bad.empty()) {
    const size_t n = bad.size();
    if (bad.size() > 8) bad.resize(8);
    return absl::DataLossError(absl::StrCat(
        "verification failed for version ", version, ": ", n,
        " destination range(s) differ from the sender's bytes: ", absl::StrJoin(bad, ", "),
        n > 8 ? ", ..." : ""));
  }
  return absl::OkStatus();
}

}  // namespace wb::delta
